"""Generation-safe P4Runtime updates: what to write so that a switch running one rule set's
entries runs another's, without a packet ever classified by a mix of the two.

Both rule sets are :class:`~.state_index.StateIndex` es (the loaded one the writer's record of the
switch, :mod:`.record`, or read back from it, :mod:`.readback`; the new one compiled), and the
plan reads the entries of the states it writes or deletes only: its work is proportional to the
change, not to the rule set.  Their tables are keyed by a *state* (the metadata field ``subc_state``, one
per message slot in the multi-message program) and every stage's actions set the next state, so
the entries form a diagram from the root state, which the program reads from the default action
of the keyless table ``subc_root`` (entries.json ``root``).  The update:

1. gives every state a *signature* (:class:`.state_index.StateIndex`): a hash of its entries
   with the next states replaced by their signatures and multicast groups by their port sets
   (bottom-up; states of equal signature classify every packet alike);
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
from ...backends.p4.state_index import (
    DEAD,
    GROUP_ACTION,
    Node,
    NodeInfo,
    Row,
    StateIndex,
    canonical_match,
    stage_of,
    state_key_index,
)
from ...errors import SubcError


@dataclass
class UpdatePlan:
    """The phases of an update (see the module docstring):
    ``group_inserts`` ((group, ports)); ``spare_deletes``, ``inserts``, ``modifies`` (before
    the root switch) and ``deletes`` (after it) as (table, entry); ``root`` (the new root state,
    or None when it stays), ``group_deletes`` (group ids); ``held``: what the switch holds once
    the plan is written (the new rule set in the switch's numbering of states and groups, and the
    ``spare`` root's entries)."""

    group_inserts: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    spare_deletes: list[tuple[str, Entry]] = field(default_factory=list)
    inserts: list[tuple[str, Entry]] = field(default_factory=list)
    modifies: list[tuple[str, Entry]] = field(default_factory=list)
    root: int | None = None
    deletes: list[tuple[str, Entry]] = field(default_factory=list)
    group_deletes: list[int] = field(default_factory=list)
    held: StateIndex | None = None
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

    @property
    def doc(self) -> EntriesDoc:
        """The new rule set as the switch holds it (its numbering), the spare root's entries aside."""
        assert self.held is not None, "a plan made by plan_update"
        return self.held.to_doc(without=None if self.spare is None else (0, self.spare))


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


def plan_update(old: EntriesDoc | StateIndex, new: EntriesDoc | StateIndex) -> UpdatePlan:
    """The update from ``old`` (what the switch holds) to ``new`` (as compiled), each an
    entries.json document or its :class:`~.state_index.StateIndex`.

    Reads the entries of the nodes it writes or deletes only (the new root's and the spare's:
    one entry per value of the first field); the rest is a pass over the two indexes' heads
    (signatures and next states).

    Raises SubcError when ``new`` needs another program (a table, key or default action that
    differs), a change to a table not keyed by state, or more states than the state field of
    the loaded program holds beside the loaded ones."""
    o = old if isinstance(old, StateIndex) else StateIndex.from_doc(old)
    n = new if isinstance(new, StateIndex) else StateIndex.from_doc(new, spares=False)
    _check_same_program(o.skeleton, n.skeleton)
    spares = o.spare_roots()
    # the spare: the earlier root with the most entries (their children may be gone: no signature)
    spare = max(spares, key=lambda x: (sum(o.nodes[x].counts.values()), -x[1]), default=None)
    plan = UpdatePlan()
    group_map = _number_groups(o, n, plan)
    nb = _number_states(o, n, spares, spare, plan)
    number, target = nb.number, nb.target
    new_root = n.root if n.root == DEAD else number[(0, n.root)]
    switching = new_root != o.root
    plan.root = new_root if switching else None
    plan.spare = o.root if switching else (spare[1] if spare else None)
    renumber = _Renumber(number, group_map)
    old_nodes, new_nodes = o.nodes, n.nodes
    for node, mine in sorted(x for x in nb.kept if x[1] not in nb.checked):  # (kept: the switch holds their entries)
        _check_kept(o, n, node, mine, number)
    kept = {mine for _, mine in nb.kept}
    held_nodes = {x: info for x, info in old_nodes.items() if x in kept}  # (in the switch's order)
    held_lines = {x: o.line(x) for x in held_nodes}
    held_heads = o.read_heads(held_nodes)
    held_rows: dict[Node, dict[str, list[Row]]] = {}
    for node in nb.written:
        info = new_nodes[node]
        k = node[0]
        mine = (k, number[node])
        if mine == target:
            rows = _rewrite_spare(o, n.rows(node), target, renumber, plan)
        else:
            rows = {t: [renumber.row(k, r) for r in rs] for t, rs in n.rows(node).items()}
            plan.inserts += [(t, o.entry(t, mine[1], r)) for t, rs in rows.items() for r in rs]
        held_nodes[mine] = NodeInfo(info.sig, tuple(renumber.state(k + 1, c) for c in info.children), info.counts)
        held_rows[mine] = rows  # (serialized when the record is written, after the writes)
    shared = {t: tuple(renumber.entry(e) for e in es) for t, es in n.shared.items()}
    _shared_differences(o, shared, plan)
    keep = held_nodes.keys() | ({(0, plan.spare)} if plan.spare is not None else set())
    for node in sorted(old_nodes.keys() - keep):
        plan.deletes += [(t, e) for t, es in o.entries(node).items() for e in es]
    sp = (0, plan.spare)
    if sp not in held_nodes and sp in old_nodes:  # (a root without entries, the dead state, has none to keep)
        held_nodes[sp] = replace(old_nodes[sp], sig=None)
        held_lines[sp] = o.line(sp)
    skeleton = replace(
        n.skeleton,
        initial_state=new_root,
        multicast_groups=tuple((group_map[g], p) for g, p in sorted(n.groups.items())),
    )
    plan.held = StateIndex(skeleton, held_nodes, shared, lines=held_lines, heads=held_heads, rows=held_rows)
    return plan


class _Renumber:
    """The new rule set's next states and multicast groups in the switch's numbering (``number``:
    new node -> state on the switch; ``group_map``: new group id -> id on the switch)."""

    def __init__(self, number: dict[Node, int], group_map: dict[int, int]):
        self.number, self.group_map = number, group_map

    def state(self, k: int, s: int) -> int:
        """State ``s`` of stage ``k`` on the switch."""
        return s if s == DEAD else self.number[(k, s)]

    def params(self, k: int, action: str, params: dict) -> dict:
        """The parameters of an entry of stage ``k`` (``params`` itself when none is renumbered)."""
        ns = params.get("next_state")
        if ns is not None and ns != DEAD:
            params = {**params, "next_state": self.number[(k + 1, ns)]}
        if action == GROUP_ACTION[0]:
            params = {**params, GROUP_ACTION[1]: self.group_map[params[GROUP_ACTION[1]]]}
        return params

    def row(self, k: int, r: Row) -> Row:
        """Row ``r`` of a node of stage ``k`` (the state key is not in it: :mod:`.state_index`)."""
        params = self.params(k, r[2], r[3])
        return r if params is r[3] else [r[0], r[1], r[2], params]

    def entry(self, e: Entry) -> Entry:
        """Entry ``e`` of a table keyed by no state, its multicast group renumbered."""
        if e.action != GROUP_ACTION[0]:
            return e
        group = self.group_map[e.params[GROUP_ACTION[1]]]
        return Entry(e.match, e.priority, e.action, {**e.params, GROUP_ACTION[1]: group})


def _key(index: StateIndex, table: str, e: Entry) -> tuple:
    """The canonical match (and priority) of entry ``e`` of ``table``: equal for equal matches."""
    return tuple(canonical_match(m, b) for m, b in zip(e.match, index.tables[table].bits)), e.priority


def _check_kept(o: StateIndex, n: StateIndex, node: Node, mine: Node, number: dict[Node, int]) -> None:
    """SubcError unless the switch's node ``mine``, kept for the new ``node`` of equal signature,
    leads where the new numbering puts ``node``'s children (it does unless the switch holds two
    states of one signature)."""
    k = node[0]
    want = sorted(c if c == DEAD else number[(k + 1, c)] for c in n.nodes[node].children)
    if sorted(o.nodes[mine].children) != want:
        raise SubcError(
            f"state {mine[1]} of stage {k} on the switch leads to states {sorted(set(o.nodes[mine].children))} "
            f"where the update would lead to {sorted(set(want))} (the switch holds two states of one "
            "signature): that cannot be switched atomically; reload the switch (subc load --config)"
        )


def _rewrite_spare(
    o: StateIndex, new_rows: dict[str, list[Row]], target: Node, renumber: _Renumber, plan: UpdatePlan
) -> dict[str, list[Row]]:
    """The writes that turn the spare root ``target``'s entries into the new root's (``new_rows``,
    the new numbering's): DELETE what it has and the new root lacks (before the inserts), INSERT
    what is new, MODIFY what changed.  Returns the new root's rows in the switch's numbering (the
    spare's own rows where they are equal)."""
    state = target[1]
    spare = o.rows(target)
    have = {t: {o.row_key(t)(r): r for r in rs} for t, rs in spare.items()}
    out = {}
    for t, rs in new_rows.items():
        key, left, res = o.row_key(t), have.get(t, {}), []
        for r in rs:
            params = renumber.params(0, r[2], r[3])
            old = left.pop(key(r), None)
            if old is not None and old[2] == r[2] and old[3] == params:
                res.append(old)
                continue
            mine = r if params is r[3] else [r[0], r[1], r[2], params]
            res.append(mine)
            (plan.inserts if old is None else plan.modifies).append((t, o.entry(t, state, mine)))
        out[t] = res
    plan.spare_deletes += [(t, o.entry(t, state, r)) for t, left in have.items() for r in left.values()]
    return out


def _shared_differences(o: StateIndex, shared: dict[str, tuple[Entry, ...]], plan: UpdatePlan) -> None:
    """Entries of the tables keyed by no state: the new ones inserted, the gone ones deleted;
    SubcError for one whose action changes (both rule sets use it: it cannot be switched)."""
    for t in sorted(set(shared) | set(o.shared)):
        have = {_key(o, t, e): e for e in o.shared.get(t, ())}
        want = {_key(o, t, e): e for e in shared.get(t, ())}
        for key, e in want.items():
            old = have.get(key)
            if old is None:
                plan.inserts.append((t, e))
            elif (old.action, old.params) != (e.action, e.params):
                raise SubcError(
                    f"table {t} is shared by both rule sets and the update changes its entry {list(key[0])} "
                    f"from {old.action}{dict(old.params)} to {e.action}{dict(e.params)}: that cannot be "
                    "switched atomically; reload the switch (subc load --config)"
                )
        plan.deletes += [(t, e) for key, e in have.items() if key not in want]


def _number_groups(o: StateIndex, n: StateIndex, plan: UpdatePlan) -> dict[int, int]:
    """New group id -> the id on the switch: the loaded id of a port set the switch has, a free
    id for the others (inserted); the loaded groups no port set keeps are deleted."""
    old_ids = {ports: gid for gid, ports in o.groups.items()}
    used_ids = set(o.groups)
    group_map: dict[int, int] = {}
    next_id = 1
    for gid, ports in sorted(n.groups.items()):
        if ports in old_ids:
            group_map[gid] = old_ids[ports]
            continue
        while next_id in used_ids:
            next_id += 1
        group_map[gid] = next_id
        used_ids.add(next_id)
        plan.group_inserts.append((next_id, ports))
    kept_groups = set(group_map.values())
    plan.group_deletes = sorted(g for g in o.groups if g not in kept_groups)
    return group_map


@dataclass
class _Numbering:
    """The new rule set's states on the switch (:func:`_number_states`): ``number`` (new node ->
    state on the switch), ``kept`` ((new node, the switch's node of its signature) for the new
    nodes with entries the switch holds), ``written`` (the other new nodes with entries, sorted),
    ``target`` (the spare, when the new root is written into it) and ``checked``: the switch's
    nodes that a new node of equal signature may keep without :func:`_check_kept`."""

    number: dict[Node, int] = field(default_factory=dict)
    kept: list[tuple[Node, Node]] = field(default_factory=list)
    written: list[Node] = field(default_factory=list)
    target: Node | None = None
    checked: set[Node] = field(default_factory=set)


def _number_states(
    o: StateIndex, n: StateIndex, spares: list[Node], spare: Node | None, plan: UpdatePlan
) -> _Numbering:
    """The numbering of the new rule set's states: kept where the switch holds the node's
    signature, the spare for a new root, else a number no loaded state of its stage uses
    (SubcError when the state field has none left).

    When the switch holds one node per signature and stage (spares aside), a kept node reachable
    from the switch's root needs no check: its children are reachable too, so each is the one
    node of its signature, which is where the new numbering puts the new node's children (equal
    signatures have children of equal signatures).  Otherwise every kept node is checked, and of
    nodes of equal signature the largest state is kept."""
    out = _Numbering()
    reach = o.reachable()
    every = reach | o.nodes.keys() | {(0, o.root)}
    signed = every.difference(spares)
    sig = o.signature
    by_sig = {(x[0], sig(x)): x[1] for x in signed}
    if len(by_sig) == len(signed):
        out.checked = reach
    else:
        by_sig = {(x[0], sig(x)): x[1] for x in sorted(signed)}
    number, has, nsig = out.number, n.nodes, n.signature
    others = []
    for node in n.reachable() | has.keys():
        if node[1] == DEAD:
            continue
        x = by_sig.get((node[0], nsig(node)))
        if x is None:
            others.append(node)
            continue
        number[node] = x
        if node in has:
            out.kept.append((node, (node[0], x)))
    plan.kept_states += len(number)
    plan.new_states += len(others)
    width = o.skeleton.state_width
    free: dict[int, Iterator[int]] = {}
    for node in sorted(others):
        k = node[0]
        if node == (0, n.root) and spare is not None:
            number[node], out.target = spare[1], spare
        else:
            if k not in free:
                free[k] = _free_states(every, k, width)
            x = next(free[k], None)
            if x is None:
                used = sum(1 for j, _ in every if j == k)
                raise SubcError(
                    f"the new rule set needs more states at stage {k} than the loaded program's {width}-bit "
                    f"state field holds beside the {used} loaded ones: reload the switch "
                    "with the new program (subc load --config)"
                )
            number[node] = x
        if node in has:
            out.written.append(node)
    return out


def _free_states(every: set[Node], k: int, width: int) -> Iterator[int]:
    """The states of stage ``k`` that no node of ``every`` uses, ascending (the dead state aside)."""
    used = {s for j, s in every if j == k}
    return (x for x in range(1, 1 << width) if x not in used)


def with_spare_root(doc: EntriesDoc) -> EntriesDoc:
    """``doc`` with a copy of the root's entries under the smallest state number the
    first stage does not use: the spare root a first update writes its root into by difference
    (see the module docstring).  No packet reaches it."""
    used = {doc.initial_state}
    for t in doc.tables:
        i = state_key_index(t)
        if i is not None and stage_of(doc, t) == 0:
            used.update(e.match[i].a for e in t.entries)
    spare = next(n for n in range(1, 1 << doc.state_width) if n not in used)
    tables = []
    for t in doc.tables:
        i = state_key_index(t)
        extra = []
        if i is not None and stage_of(doc, t) == 0:
            for e in t.entries:
                m = e.match[i]
                if m.kind == "exact" and m.a == doc.initial_state:
                    extra.append(replace(e, match=e.match[:i] + (Match("exact", spare),) + e.match[i + 1 :]))
        tables.append(replace(t, entries=t.entries + tuple(extra)))
    return replace(doc, tables=tuple(tables))
