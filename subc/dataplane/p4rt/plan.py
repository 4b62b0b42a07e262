"""Generation-safe P4Runtime updates: what to write so that a switch running one rule set's
entries runs another's, without a packet ever classified by a mix of the two.

Both rule sets are ``entries.json`` documents (the loaded one as read back from the switch,
:mod:`.readback`).  Their tables are keyed by a *state* (the metadata field ``subc_state``, one
per message slot in the multi-message program) and every stage's actions set the next state, so
the entries form a diagram from the root state, which the program reads from the default action
of the keyless table ``subc_root`` (entries.json ``root``).  The update:

1. gives every state a *signature* (:class:`.diagram.Diagram`): a hash of its entries with the next states replaced by
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

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from ...backends.p4.entries_doc import Entry, EntriesDoc, Match
from ...errors import SubcError
from .diagram import DEAD, GROUP_ACTION, Diagram, Node, rows, stage_of, state_key_index


@dataclass
class UpdatePlan:
    """The phases of an update (see the module docstring):
    ``group_inserts`` ((group, ports)); ``spare_deletes``, ``inserts``, ``modifies`` (before
    the root switch) and ``deletes`` (after it) as (table, entry); ``root`` (the new root state,
    or None when it stays), ``group_deletes`` (group ids); ``doc`` is the new rule set as the
    switch will hold it (renumbered states and groups), beside the ``spare`` root's entries."""

    group_inserts: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    spare_deletes: list[tuple[str, Entry]] = field(default_factory=list)
    inserts: list[tuple[str, Entry]] = field(default_factory=list)
    modifies: list[tuple[str, Entry]] = field(default_factory=list)
    root: int | None = None
    deletes: list[tuple[str, Entry]] = field(default_factory=list)
    group_deletes: list[int] = field(default_factory=list)
    doc: EntriesDoc | None = None
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


def _check_same_program(old: EntriesDoc, new: EntriesDoc) -> None:
    if old.state is not None or new.state is not None:
        raise SubcError(
            "the rules compare state (aggregates): their registers belong to the program, which an "
            "update over P4Runtime cannot empty or reshape together with the switch to the new rule set; "
            "reload the switch with the new program (subc load --config), which starts them empty"
        )
    if old.field_order != new.field_order:
        raise SubcError(
            f"the new rule set's field order {', '.join(new.field_order)} is not the loaded program's "
            f"({', '.join(old.field_order)}): compile it with --field-order "
            f"{','.join(old.field_order)}, or reload the switch with the new program (subc load --config)"
        )
    om, nm = (old.messages.to_json() if old.messages else {}), (new.messages.to_json() if new.messages else {})
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
    ot, nt = {t.name: t for t in old.tables}, {t.name: t for t in new.tables}
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
        if [(k.name, k.match_kind) for k in a.keys] != [(k.name, k.match_kind) for k in b.keys]:
            raise SubcError(
                f"table {name} has other keys in the new rule set's program: reload the switch "
                "with the new program (subc load --config)"
            )
        if a.default_action != b.default_action:
            raise SubcError(
                f"table {name}: the new rule set's default action {b.default_action.to_json()} differs from "
                f"the loaded {a.default_action.to_json()} (fixed by the program): reload the switch with "
                "the new program (subc load --config)"
            )


def plan_update(old: EntriesDoc, new: EntriesDoc) -> UpdatePlan:
    """The update from ``old`` (entries.json as the switch holds it) to ``new`` (as compiled).

    Raises SubcError when ``new`` needs another program (a table, key or default action that
    differs), a change to a table not keyed by state, or more states than the state field of
    the loaded program holds beside the loaded ones."""
    _check_same_program(old, new)
    od = Diagram(old)
    spares = od.spare_roots()
    # the spare: the earlier root with the most entries (their children may be gone: no signature)
    spare = max(spares, key=lambda n: (len(od.by_state[n]), -n[1]), default=None)
    plan = UpdatePlan()
    group_map = _number_groups(od, new, plan)
    # the new rule set with the loaded group ids
    remapped = replace(
        new,
        tables=tuple(replace(t, entries=tuple(_map_groups(e, group_map) for e in t.entries)) for t in new.tables),
        multicast_groups=tuple((group_map[g], p) for g, p in sorted(new.groups.items())),
    )
    nd = Diagram(remapped)
    number, target = _number_states(od, nd, spares, spare, old.state_width, plan)
    renum = _renumber(remapped, number)
    plan.doc = renum
    _differences(old, renum, od, nd, target, spare, plan)
    switching = renum.initial_state != old.initial_state
    plan.root = renum.initial_state if switching else None
    plan.spare = od.root if switching else (spare[1] if spare else None)
    return plan


def _number_groups(od: Diagram, new: EntriesDoc, plan: UpdatePlan) -> dict[int, int]:
    """New group id -> the id on the switch: the loaded id of a port set the switch has, a free
    id for the others (inserted); the loaded groups no port set keeps are deleted."""
    old_ids = {ports: gid for gid, ports in od.groups.items()}
    used_ids = set(od.groups)
    group_map: dict[int, int] = {}
    next_id = 1
    for gid, ports in sorted(new.groups.items()):
        if ports in old_ids:
            group_map[gid] = old_ids[ports]
            continue
        while next_id in used_ids:
            next_id += 1
        group_map[gid] = next_id
        used_ids.add(next_id)
        plan.group_inserts.append((next_id, ports))
    kept_groups = set(group_map.values())
    plan.group_deletes = sorted(g for g in od.groups if g not in kept_groups)
    return group_map


def _number_states(
    od: Diagram, nd: Diagram, spares: list[Node], spare: Node | None, width: int, plan: UpdatePlan
) -> tuple[dict[Node, int], Node | None]:
    """(new node -> state number on the switch, the spare when the new root is written into it):
    kept where the switch holds the node's signature, the spare for a new root, else a number no
    loaded state of its stage uses (SubcError when the ``width``-bit state field has none left)."""
    every = od.reachable() | od.states()
    by_sig = {(n[0], od.signature(n)): n[1] for n in sorted(every - set(spares))}
    number: dict[Node, int] = {}
    taken: dict[int, set[int]] = {}
    for k, s in every:
        taken.setdefault(k, set()).add(s)
    free: dict[int, Iterator[int]] = {}
    target: Node | None = None
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
    return number, target


def _differences(
    old: EntriesDoc,
    renum: EntriesDoc,
    od: Diagram,
    nd: Diagram,
    target: Node | None,
    spare: Node | None,
    plan: UpdatePlan,
) -> None:
    """The entries to insert, modify (the spare's, when the new root is written into it) and
    delete, table by table.  SubcError when an entry both rule sets hold changes its action
    elsewhere (that cannot be switched atomically)."""
    old_rows = {(r.table, r.key): r for r in rows(old)}
    new_rows = {(r.table, r.key): r for r in rows(renum)}
    switching = renum.initial_state != old.initial_state
    old_root = (0, od.root)
    for k, r in new_rows.items():
        o = old_rows.get(k)
        if o is None:
            plan.inserts.append((r.table, r.entry(nd.tables[r.table].keys)))
        elif (o.action, o.params) != (r.action, r.params):
            if target is not None and od.node_of(o) == target:
                plan.modifies.append((r.table, r.entry(nd.tables[r.table].keys)))
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
        owner = od.node_of(r)
        if owner is not None and owner == target:
            plan.spare_deletes.append((r.table, r.entry(od.tables[r.table].keys)))
        elif owner is not None and (owner == old_root if switching else owner == spare):
            continue  # the next spare
        else:
            plan.deletes.append((r.table, r.entry(od.tables[r.table].keys)))


def with_spare_root(doc: EntriesDoc) -> EntriesDoc:
    """``doc`` with a copy of the root's entries under the smallest state number the
    first stage does not use: the spare root a first update writes its root into by difference
    (see the module docstring).  No packet reaches it."""
    d = Diagram(doc)
    used = {n[1] for n in d.states() if n[0] == 0}
    spare = next(n for n in range(1, 1 << doc.state_width) if n not in used)
    tables = []
    for t in doc.tables:
        i = state_key_index(t)
        extra = []
        if i is not None and stage_of(doc, t) == 0:
            for e in t.entries:
                m = e.match[i]
                if m.kind == "exact" and m.a == d.root:
                    extra.append(replace(e, match=e.match[:i] + (Match("exact", spare),) + e.match[i + 1 :]))
        tables.append(replace(t, entries=t.entries + tuple(extra)))
    return replace(doc, tables=tuple(tables))


def _map_groups(e: Entry, group_map: dict[int, int]) -> Entry:
    if e.action != GROUP_ACTION[0]:
        return e
    p = dict(e.params)
    p[GROUP_ACTION[1]] = group_map[p[GROUP_ACTION[1]]]
    return replace(e, params=p)


def _renumber(doc: EntriesDoc, number: dict[Node, int]) -> EntriesDoc:
    """``doc`` with every state (state keys, next_state parameters, the root) renumbered by
    ``number`` ((stage, state) -> state; the dead state stays)."""

    def num(k: int, s: int) -> int:
        return s if s == DEAD else number[(k, s)]

    tables = []
    for t in doc.tables:
        i, k = state_key_index(t), stage_of(doc, t)
        entries = []
        for e in t.entries:
            e2 = e
            if i is not None:
                m = Match("exact", num(k, e.match[i].a))
                e2 = replace(e2, match=e.match[:i] + (m,) + e.match[i + 1 :])
            if "next_state" in e.params:
                e2 = replace(e2, params={**e.params, "next_state": num(k + 1, e.params["next_state"])})
            entries.append(e2)
        tables.append(replace(t, entries=tuple(entries)))
    return replace(doc, initial_state=num(0, doc.initial_state), tables=tuple(tables))
