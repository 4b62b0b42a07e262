"""Table simulator: run a packet through the emitted entries (``entries.json``) as a switch would.

It reads nothing but the ``entries.json`` document, and follows P4 table semantics: exact keys
must be equal, range keys contain the value, lpm keys pick the longest prefix, ternary keys
match under the mask; among several hits of a table with range or ternary keys the largest
priority wins (P4Runtime convention); a miss runs the default action, and a step's ``on_miss``
table is applied when its table missed.  The actions of the last stage (and the document's
``default_action``) map to a :class:`Decision` (multicast groups resolved through
``multicast_groups``).
"""

from __future__ import annotations

from collections import defaultdict

from .reference import Decision

_BUILTIN = {"subc_drop": ("drop",), "subc_nop": ("nop",)}


def leaf_decision(action: str, params: dict, groups: dict[int, tuple[int, ...]]) -> Decision:
    """The :class:`Decision` of a leaf action of ``entries.json`` (``groups``: multicast group ->
    sorted ports).  Raises KeyError for an unknown multicast group."""
    if action == "subc_fwd":
        return Decision((params["port"],), None)
    if action == "subc_mcast":
        return Decision(groups[params["group"]], None)
    if action in _BUILTIN:
        return Decision((), _BUILTIN[action])
    return Decision((), (action, *params.values()))


class _Table:
    """One table with an index for the common shapes: (state exact, X) keys are grouped by state."""

    def __init__(self, doc: dict):
        self.name = doc["name"]
        self.keys = doc["keys"]
        self.default = (doc["default_action"]["action"], doc["default_action"]["params"])
        self.entries = doc["entries"]
        self.kinds = [k["match_kind"] for k in self.keys]
        self.by_state: dict[int, list] = defaultdict(list)
        self.exact: dict[tuple, tuple] = {}
        self.all_exact = all(k == "exact" for k in self.kinds)
        if self.all_exact:
            for e in self.entries:
                self.exact[tuple(m["exact"] for m in e["match"])] = (e["action"], e["params"])
        else:
            for e in self.entries:
                first = e["match"][0]
                self.by_state[first.get("exact")].append(e)

    def lookup(self, values: list[int]) -> tuple[bool, tuple[str, dict]]:
        """(hit, (action, params)) for key ``values`` in key order."""
        if self.all_exact:
            hit = self.exact.get(tuple(values))
            return (True, hit) if hit is not None else (False, self.default)
        candidates = self.by_state.get(values[0] if self.kinds[0] == "exact" else None, [])
        best, best_rank = None, None
        for e in candidates:
            rank = 0
            ok = True
            for kind, m, v, k in zip(self.kinds, e["match"], values, self.keys):
                if kind == "exact":
                    ok = m["exact"] == v
                elif kind == "range":
                    lo, hi = m["range"]
                    ok = lo <= v <= hi
                elif kind == "lpm":
                    value, plen = m["lpm"]
                    shift = k["bitwidth"] - plen
                    ok = (v >> shift) == (value >> shift)
                    rank = plen
                else:
                    value, mask = m["ternary"]
                    ok = (v & mask) == (value & mask)
                if not ok:
                    break
            if not ok:
                continue
            if "priority" in e:
                rank = e["priority"]
            if best is None or rank > best_rank:
                best, best_rank = e, rank
        if best is None:
            return False, self.default
        return True, (best["action"], best["params"])


class TableSimulator:
    """Run packets through the tables of an ``entries.json`` document.

    ``process(packet)`` takes ``{'header.field': value}`` and the set of valid header instances
    (all headers the fields belong to, when omitted) and returns a :class:`Decision`.
    """

    def __init__(self, doc: dict):
        if doc.get("format") != "subc-entries":
            raise ValueError("not a subc entries.json document")
        self.doc = doc
        self.tables = {t["name"]: _Table(t) for t in doc["tables"]}
        self.steps = [(s["table"], s["on_miss"]) for s in doc["pipeline"]]
        self.groups = {g["group"]: tuple(sorted(g["ports"])) for g in doc["multicast_groups"]}
        self.headers = doc["headers"]
        self.default_action = (doc["default_action"]["action"], doc["default_action"]["params"])
        self.state_key = doc["state_key"]
        self.code_key = self.state_key.rsplit(".", 1)[0] + ".subc_code"
        self.trace: list[tuple[str, bool, str]] = []

    def _key_value(self, key: dict, packet: dict[str, int], meta: dict[str, int]) -> int:
        name = key["name"]
        if name in meta:
            return meta[name]
        field = name.split(".", 1)[1]
        return packet[field]

    def _decision(self, action: str, params: dict) -> Decision:
        return leaf_decision(action, params, self.groups)

    def process(self, packet: dict[str, int], valid: set[str] | None = None, trace: bool = False) -> Decision:
        """The decision for ``packet`` (see the class docstring)."""
        if valid is not None and not all(h in valid for h in self.headers):
            return self._decision(*self.default_action)
        state_key = self.state_key
        meta = {state_key: self.doc["initial_state"], self.code_key: 0}
        if trace:
            self.trace = []
        result = None
        for table_name, on_miss in self.steps:
            for name in (table_name, on_miss):
                if name is None:
                    continue
                t = self.tables[name]
                hit, (action, params) = t.lookup([self._key_value(k, packet, meta) for k in t.keys])
                if trace:
                    self.trace.append((name, hit, action))
                if action == "subc_set_state":
                    meta[state_key] = params["next_state"]
                elif action == "subc_set_code":
                    meta[self.code_key] = params["code"]
                elif action != "NoAction":
                    result = self._decision(action, params)
                if hit or name == on_miss:
                    break
        return result if result is not None else self._decision(*self.default_action)
