"""Generation-safe P4Runtime updates: what to write so that a switch running one rule set's
entries runs another's, without a packet ever classified by a mix of the two.

Both rule sets are ``entries.json`` documents (the loaded one as read back from the switch,
:mod:`.readback`).  Their tables are keyed by a *state* (the metadata field ``subc_state``, one
per message slot in the multi-message program) and every stage's actions set the next state, so
the entries form a diagram from the root state, which the program reads from the default action
of the keyless table ``subc_root`` (entries.json ``root``).  The update:

1. gives every state a *signature*: a hash of its entries with the next states replaced by
   their signatures and multicast groups by their port sets (bottom-up; states of equal
   signature classify every packet alike);
2. numbers the new rule set's states: a state whose signature the switch already holds keeps the
   switch's number (its entries are already there, nothing is written), any other state takes a
   number no loaded state uses (the state field has a spare bit, ``subc compile``);
3. writes the new root into the *spare root*: a root state no packet reaches, holding an earlier
   root's entries (``subc load`` writes a copy of the root there; every update keeps the root it
   replaces as the next spare).  Roots of consecutive rule sets share most entries, so the new
   root costs only the entries that differ (DELETE, INSERT, MODIFY under the spare state), not
   the whole root table (the first field's table: one entry per value of it, thousands);
4. writes, in this order, each phase acknowledged before the next starts (a P4Runtime
   ``WriteRequest`` may apply its updates in any order, section 12):
   the new multicast groups (INSERT); the spare's entries the new root lacks (DELETE); the new
   states' entries, new entries of the tables not keyed by state and the spare's changed entries
   (INSERT, MODIFY: no packet reaches them yet); the root (MODIFY of ``subc_root``'s default
   action, one update: packets that start after it use the new states only); after a grace
   period, the entries only the old states had (the old root's aside: the next spare) and the
   groups no longer used (DELETE).

A packet reads the root once, so it sees either the old diagram, all of whose entries stay until
after the switch, or the new one, all of whose entries are written before it.  The spare's
entries may name states and groups that were deleted since: no packet reaches them, and each of
them is rewritten, deleted or found equal to the new root's before the spare becomes the root.  The multi-message
program's subscriber ports, withheld actions and slots must be the loaded ones.  Tables not keyed
by state (the multi-message program's ``subc_deliver`` and ``subc_port_bit``, Tofino's interval
code tables) are shared by both: the update may add entries to them but not change or remove
one the old rule set uses; :class:`~subc.errors.SubcError` says so (that rule set needs the
program reloaded, ``subc load --config``).  So do a different default action of a table (fixed
by the program) and a lack of state numbers.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from ...errors import SubcError

STATE_KEY = re.compile(r"(^|\.)subc_(s\d+_)?state$")
#: the action whose ``group`` parameter names a multicast group (single-message programs)
GROUP_ACTION = ("subc_mcast", "group")
DEAD = 0  # the dead state: no entries, every table's miss leads there
Node = tuple  # (field stage, state): state numbers are per stage


def stage_of(doc: dict, table: dict) -> int:
    """The field stage of ``table``: the index of its field in the document's field order (0 for a
    table with no field: the leaf table keyed by the root state alone)."""
    return doc["field_order"].index(table["field"]) if table.get("field") else 0


def state_key_index(table: dict) -> int | None:
    """Position of the state key among ``table``'s keys (entries.json form), or None."""
    for i, k in enumerate(table["keys"]):
        if STATE_KEY.search(k["name"]):
            return i
    return None


def canonical_match(m: dict, bits: int) -> tuple:
    """A hashable form of entries.json match element ``m`` of a ``bits``-bit key in which equal
    matches are equal: lpm values masked to their prefix, ternary values to their mask, a
    whole-field range, lpm /0 and ternary mask 0 all ``('any',)`` (as P4Runtime omits them)."""
    top = (1 << bits) - 1
    if "exact" in m:
        return ("exact", m["exact"])
    if "range" in m:
        lo, hi = m["range"]
        return ("any",) if (lo, hi) == (0, top) else ("range", lo, hi)
    if "lpm" in m:
        v, plen = m["lpm"]
        return ("any",) if plen == 0 else ("lpm", v & (top ^ ((1 << (bits - plen)) - 1)), plen)
    if "ternary" in m:
        v, mask = m["ternary"]
        return ("any",) if mask == 0 else ("ternary", v & mask, mask)
    raise SubcError(f"unknown match element {m}")


@dataclass
class Row:
    """One entry in canonical form: ``key`` (match elements, priority) and ``value`` (action and
    sorted parameters)."""

    table: str
    key: tuple
    action: str
    params: tuple

    def entry(self, keys: list[dict]) -> dict:
        """The entries.json form, for the table's ``keys`` (entries.json)."""
        match, priority = self.key
        out = {"match": [entry_match(m, k) for m, k in zip(match, keys)]}
        if priority is not None:
            out["priority"] = priority
        out["action"] = self.action
        out["params"] = dict(self.params)
        return out


def _match_json(m: tuple) -> dict:
    return {"exact": m[1]} if m[0] == "exact" else {m[0]: [m[1], m[2]]}


def rows(doc: dict) -> list[Row]:
    """Every entry of ``doc`` as a :class:`Row`."""
    out = []
    for t in doc["tables"]:
        bits = [k["bitwidth"] for k in t["keys"]]
        for e in t["entries"]:
            match = tuple(canonical_match(m, b) for m, b in zip(e["match"], bits))
            out.append(
                Row(t["name"], (match, e.get("priority")), e["action"], tuple(sorted(e.get("params", {}).items())))
            )
    return out


def entry_match(m: tuple, key: dict) -> dict:
    """The entries.json match element of canonical element ``m`` for ``key`` (entries.json)."""
    if m[0] != "any":
        return _match_json(m)
    kind, top = key["match_kind"], (1 << key["bitwidth"]) - 1
    return {"range": [0, top]} if kind == "range" else {"lpm": [0, 0]} if kind == "lpm" else {"ternary": [0, 0]}


class Diagram:
    """The state diagram of an entries.json document ``doc``: rows by state, rows of the tables
    not keyed by state (``shared``), multicast groups, the root and the signatures."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.root = doc["initial_state"]
        self.state_width = doc["state_width"]
        self.groups = {g["group"]: tuple(sorted(g["ports"])) for g in doc.get("multicast_groups", [])}
        self.state_at = {t["name"]: state_key_index(t) for t in doc["tables"]}
        self.stage = {t["name"]: stage_of(doc, t) for t in doc["tables"]}
        self.tables = {t["name"]: t for t in doc["tables"]}
        self.by_state: dict[Node, list[Row]] = {}
        self.shared: list[Row] = []
        for r in rows(doc):
            i = self.state_at[r.table]
            if i is None:
                self.shared.append(r)
            else:
                self.by_state.setdefault((self.stage[r.table], r.key[0][i][1]), []).append(r)
        self._sig: dict[Node, bytes] = {}

    def states(self) -> set[Node]:
        """Every node with entries, and the root."""
        return set(self.by_state) | {(0, self.root)}

    def node_of(self, r: Row) -> Node | None:
        """The node whose entry ``r`` is (None: a table not keyed by state)."""
        i = self.state_at[r.table]
        return None if i is None else (self.stage[r.table], r.key[0][i][1])

    def spare_roots(self) -> list[Node]:
        """The nodes of the first stage with entries, the root aside: earlier roots, one of which an
        update rewrites into the next root (see the module docstring)."""
        return sorted(n for n in self.by_state if n[0] == 0 and n[1] != self.root)

    def _children(self, node: Node) -> list[Node]:
        k = node[0]
        return [(k + 1, v) for r in self.by_state.get(node, ()) for p, v in r.params if p == "next_state"]

    def signature(self, node: Node) -> bytes:
        """The signature of ``node`` (16 bytes; see the module docstring)."""
        stack = [node]
        while stack:
            top = stack[-1]
            if top in self._sig:
                stack.pop()
                continue
            if top[1] == DEAD:
                self._sig[top] = b"dead"
                continue
            todo = [c for c in self._children(top) if c not in self._sig]
            if todo:  # children are a stage later: no cycle
                stack.extend(todo)
                continue
            stack.pop()
            parts = sorted(repr(self._abstract(r)) for r in self.by_state.get(top, ()))
            self._sig[top] = hashlib.blake2b("\n".join(parts).encode(), digest_size=16).digest()
        return self._sig[node]

    def _abstract(self, r: Row) -> tuple:
        """``r`` with its state key dropped, next states as signatures and groups as port sets."""
        i = self.state_at[r.table]
        match, priority = r.key
        if i is None:
            return (r.table, match, priority, r.action, r.params)
        params = []
        for p, v in r.params:
            if p == "next_state":
                v = self.signature((self.stage[r.table] + 1, v))
            elif (r.action, p) == GROUP_ACTION:
                v = self.groups.get(v, ("missing group", v))
            params.append((p, v))
        return (r.table, match[:i] + match[i + 1 :], priority, r.action, tuple(params))

    def abstract_rows(self) -> dict[str, list[str]]:
        """Table name -> sorted abstract rows (states as signatures) of the states the root
        reaches, and the rows of the tables not keyed by state."""
        out: dict[str, list[str]] = {t: [] for t in self.tables}
        for node in self.reachable():
            for r in self.by_state.get(node, ()):
                out[r.table].append(repr(self._abstract(r)))
        for r in self.shared:
            out[r.table].append(repr((r.key, r.action, r.params)))
        return {t: sorted(v) for t, v in out.items()}

    def reachable(self) -> set[Node]:
        """The nodes the root leads to, the root included, dead ones not."""
        seen: set[Node] = set()
        todo = [(0, self.root)]
        while todo:
            n = todo.pop()
            if n not in seen and n[1] != DEAD:
                seen.add(n)
                todo.extend(self._children(n))
        return seen


@dataclass
class UpdatePlan:
    """The phases of an update (see the module docstring), entries.json forms:
    ``group_inserts`` ({"group", "ports"}); ``spare_deletes``, ``inserts``, ``modifies`` (before
    the root switch) and ``deletes`` (after it) as (table, entry); ``root`` (the new root state,
    or None when it stays), ``group_deletes`` (group ids); ``doc`` is the new rule set as the
    switch will hold it (renumbered states and groups), beside the ``spare`` root's entries."""

    group_inserts: list[dict] = field(default_factory=list)
    spare_deletes: list[tuple[str, dict]] = field(default_factory=list)
    inserts: list[tuple[str, dict]] = field(default_factory=list)
    modifies: list[tuple[str, dict]] = field(default_factory=list)
    root: int | None = None
    deletes: list[tuple[str, dict]] = field(default_factory=list)
    group_deletes: list[int] = field(default_factory=list)
    doc: dict = field(default_factory=dict)
    kept_states: int = 0
    new_states: int = 0
    spare: int | None = None  # the spare root state after the update (its entries stay on the switch)

    @property
    def writes(self) -> int:
        """Updates the plan sends."""
        return (
            len(self.group_inserts)
            + len(self.spare_deletes)
            + len(self.inserts)
            + len(self.modifies)
            + (self.root is not None)
            + len(self.deletes)
            + len(self.group_deletes)
        )


def _check_same_program(old: dict, new: dict) -> None:
    if "state" in old or "state" in new:
        raise SubcError(
            "the rules compare state (aggregates): their registers belong to the program, which an "
            "update over P4Runtime cannot empty or reshape together with the switch to the new rule set; "
            "reload the switch with the new program (subc load --config), which starts them empty"
        )
    if old["field_order"] != new["field_order"]:
        raise SubcError(
            f"the new rule set's field order {', '.join(new['field_order'])} is not the loaded program's "
            f"({', '.join(old['field_order'])}): compile it with --field-order "
            f"{','.join(old['field_order'])}, or reload the switch with the new program (subc load --config)"
        )
    om, nm = old.get("messages") or {}, new.get("messages") or {}
    for what, key in (
        ("subscriber ports (the port bitmap's bits)", "ports"),
        ("withheld actions' codes", "held"),
        ("message slots", "max_messages"),
    ):
        if om.get(key) != nm.get(key):
            raise SubcError(
                f"the new rule set's {what} {nm.get(key)} differ from the loaded program's {om.get(key)}: "
                "reload the switch with the new program (subc load --config)"
            )
    ot, nt = {t["name"]: t for t in old["tables"]}, {t["name"]: t for t in new["tables"]}
    for name in ot:
        if name not in nt:
            raise SubcError(
                f"table {name} of the loaded program is not in the new rule set's: reload the switch "
                "with the new program (subc load --config)"
            )
    for name in nt:
        if name not in ot:
            raise SubcError(
                f"table {name} of the new rule set is not in the loaded program: "
                "reload the switch with the new program (subc load --config)"
            )
        a, b = ot[name], nt[name]
        if [(k["name"], k["match_kind"]) for k in a["keys"]] != [(k["name"], k["match_kind"]) for k in b["keys"]]:
            raise SubcError(
                f"table {name} has other keys in the new rule set's program: reload the switch "
                "with the new program (subc load --config)"
            )
        if a.get("default_action") != b.get("default_action"):
            raise SubcError(
                f"table {name}: the new rule set's default action {b.get('default_action')} differs from "
                f"the loaded {a.get('default_action')} (fixed by the program): reload the switch with "
                "the new program (subc load --config)"
            )


def plan_update(old: dict, new: dict) -> UpdatePlan:
    """The update from ``old`` (entries.json as the switch holds it) to ``new`` (as compiled).

    Raises SubcError when ``new`` needs another program (a table, key or default action that
    differs), a change to a table not keyed by state, or more states than the state field of
    the loaded program holds beside the loaded ones."""
    _check_same_program(old, new)
    width = old["state_width"]
    od = Diagram(old)
    spares = od.spare_roots()
    # the spare: the earlier root with the most entries (their children may be gone: no signature)
    spare = max(spares, key=lambda n: (len(od.by_state[n]), -n[1]), default=None)
    every = od.reachable() | od.states()
    live = every - set(spares)
    by_sig = {(n[0], od.signature(n)): n[1] for n in sorted(live)}
    # multicast groups: the loaded ids of port sets the switch has, free ids for the others
    old_ids = {ports: gid for gid, ports in od.groups.items()}
    used_ids = set(od.groups)
    nd_groups = {g["group"]: tuple(sorted(g["ports"])) for g in new.get("multicast_groups", [])}
    group_map, plan = {}, UpdatePlan()
    next_id = 1
    for gid, ports in sorted(nd_groups.items()):
        if ports in old_ids:
            group_map[gid] = old_ids[ports]
            continue
        while next_id in used_ids:
            next_id += 1
        group_map[gid] = next_id
        used_ids.add(next_id)
        plan.group_inserts.append({"group": next_id, "ports": list(ports)})
    kept_groups = set(group_map.values())
    plan.group_deletes = sorted(g for g in od.groups if g not in kept_groups)
    # the new rule set with the loaded group ids
    remapped = dict(new)
    remapped["tables"] = [{**t, "entries": [_map_groups(e, group_map) for e in t["entries"]]} for t in new["tables"]]
    remapped["multicast_groups"] = [{"group": group_map[g], "ports": list(p)} for g, p in sorted(nd_groups.items())]
    nd = Diagram(remapped)
    # state numbers: kept where the signature is loaded, else free ones
    number: dict[Node, int] = {}
    taken: dict[int, set[int]] = {}
    for k, s in every:
        taken.setdefault(k, set()).add(s)
    free: dict[int, object] = {}
    target = None  # the spare, when the new root is written into it
    for node in sorted(nd.reachable() | nd.states()):
        k, s = node
        if s == DEAD:
            continue
        sig = (k, nd.signature(node))
        if sig in by_sig:
            number[node] = by_sig[sig]
            plan.kept_states += 1
            continue
        if node == (0, nd.root) and spare is not None:
            number[node], target = spare[1], spare
            plan.new_states += 1
            continue
        if k not in free:
            used = taken.get(k, set())
            free[k] = (n for n in range(1, 1 << width) if n not in used)
        n = next(free[k], None)
        if n is None:
            raise SubcError(
                f"the new rule set needs more states at stage {k} than the loaded program's {width}-bit "
                f"state field holds beside the {len(taken.get(k, ()))} loaded ones: reload the switch "
                "with the new program (subc load --config)"
            )
        number[node] = n
        plan.new_states += 1
    renum = _renumber(remapped, number)
    plan.doc = renum
    # differences, table by table
    old_rows = {(r.table, r.key): r for r in rows(old)}
    new_rows = {(r.table, r.key): r for r in rows(renum)}
    switching = renum["initial_state"] != old["initial_state"]
    old_root = (0, od.root)
    for k, r in new_rows.items():
        o = old_rows.get(k)
        if o is None:
            plan.inserts.append((r.table, r.entry(nd.tables[r.table]["keys"])))
        elif (o.action, o.params) != (r.action, r.params):
            if target is not None and od.node_of(o) == target:
                plan.modifies.append((r.table, r.entry(nd.tables[r.table]["keys"])))
                continue
            kind = "is keyed by state" if od.state_at.get(r.table) is not None else "is shared by both rule sets"
            raise SubcError(
                f"table {r.table} {kind} and the update changes its entry {list(o.key[0])} "
                f"from {o.action}{dict(o.params)} to {r.action}{dict(r.params)}: that cannot be switched "
                "atomically; reload the switch (subc load --config)"
            )
    for k, r in old_rows.items():
        if k in new_rows:
            continue
        node = od.node_of(r)
        if node is not None and node == target:
            plan.spare_deletes.append((r.table, r.entry(od.tables[r.table]["keys"])))
        elif node is not None and (node == old_root if switching else node == spare):
            continue  # the next spare
        else:
            plan.deletes.append((r.table, r.entry(od.tables[r.table]["keys"])))
    plan.root = renum["initial_state"] if switching else None
    plan.spare = od.root if switching else (spare[1] if spare else None)
    return plan


def with_spare_root(doc: dict) -> dict:
    """``doc`` (entries.json) with a copy of the root's entries under the smallest state number the
    first stage does not use: the spare root a first update writes its root into by difference
    (see the module docstring).  No packet reaches it."""
    d = Diagram(doc)
    used = {n[1] for n in d.states() if n[0] == 0}
    spare = next(n for n in range(1, 1 << doc["state_width"]) if n not in used)
    out = dict(doc)
    tables = []
    for t in doc["tables"]:
        i = state_key_index(t)
        extra = []
        if i is not None and stage_of(doc, t) == 0:
            for e in t["entries"]:
                if e["match"][i].get("exact") == d.root:
                    m = list(e["match"])
                    m[i] = {"exact": spare}
                    extra.append({**e, "match": m})
        tables.append({**t, "entries": t["entries"] + extra})
    out["tables"] = tables
    return out


def _map_groups(e: dict, group_map: dict[int, int]) -> dict:
    if e["action"] != GROUP_ACTION[0]:
        return e
    p = dict(e["params"])
    p[GROUP_ACTION[1]] = group_map[p[GROUP_ACTION[1]]]
    return {**e, "params": p}


def _renumber(doc: dict, number: dict[Node, int]) -> dict:
    """``doc`` with every state (state keys, next_state parameters, the root) renumbered by
    ``number`` ((stage, state) -> state; the dead state stays)."""
    num = lambda k, s: s if s == DEAD else number[(k, s)]  # noqa: E731
    out = dict(doc)
    out["initial_state"] = num(0, doc["initial_state"])
    tables = []
    for t in doc["tables"]:
        i, k = state_key_index(t), stage_of(doc, t)
        entries = []
        for e in t["entries"]:
            e2 = dict(e)
            if i is not None:
                m = list(e["match"])
                m[i] = {"exact": num(k, m[i]["exact"])}
                e2["match"] = m
            if "next_state" in e.get("params", {}):
                e2["params"] = {**e["params"], "next_state": num(k + 1, e["params"]["next_state"])}
            entries.append(e2)
        tables.append({**t, "entries": entries})
    out["tables"] = tables
    return out


def compare(switch: dict, compiled: dict) -> list[str]:
    """Differences between the entries a switch holds (``switch``, read back) and a compiled
    rule set, up to the numbering of states and multicast groups: one line per table (or the
    groups) that differs, empty when the switch classifies every packet as ``compiled`` says."""
    a, b = Diagram(switch), Diagram(compiled)
    ta, tb = a.abstract_rows(), b.abstract_rows()
    out = []
    for name in sorted(set(ta) | set(tb)):
        x, y = ta.get(name, []), tb.get(name, [])
        if x != y:
            sx, sy = set(x), set(y)
            missing = sum(1 for r in y if r not in sx)
            extra = sum(1 for r in x if r not in sy)
            out.append(
                f"{name}: {missing} entries of the rule set are missing on the switch and {extra} entries "
                f"on the switch are not in the rule set ({len(x)} on the switch, {len(y)} compiled)"
            )
    ga, gb = sorted(a.groups.values()), sorted(b.groups.values())
    if ga != gb:
        out.append(f"multicast groups: the switch has port sets {ga}, the rule set {gb}")
    spares = a.spare_roots()
    leftover = len(a.states() - a.reachable() - {(0, a.root)} - set(spares))
    if leftover:
        out.append(f"{leftover} states on the switch are not reachable from its root (left over)")
    if len(spares) > 1:
        out.append(f"{len(spares)} earlier roots are on the switch where one (the next update's spare) is kept")
    return out
