"""Live subscriptions on a switch: the delivery diagram written as table entries over P4Runtime.

The writer of :class:`~subc.dataplane.live_broker.LiveBroker` for a program of
:func:`~subc.backends.p4.serve_program.serve_program` (the eBPF one is
:class:`~subc.dataplane.ebpf.live_maps.LiveMaps`): the same persistent nodes, root slots and grace
periods, with entries instead of map elements.  A node of level ``k`` (field ``k`` of the order)
with state ``s`` is, in the table(s) of field ``k`` (one per message slot of a multi-message
program, all with the same entries):

* **range**: the runs that do not lead to the node's fallback child, at priority
  :data:`~subc.backends.p4.tables.SPECIFIC_PRIORITY`, above one whole-field entry for the fallback
  at :data:`~subc.backends.p4.tables.FALLBACK_PRIORITY` unless that is the dead state
  (:func:`~subc.ir.lowering.range_form`);
* **exact**: one entry ``(s, v)`` per value whose child differs from the node's miss target
  (:func:`~subc.ir.lowering.exact_form`), and ``(s)`` in the ``_miss`` table for the miss
  target unless that is the default;
* **lpm**: the fewest prefixes whose longest match gives every value its child
  (:func:`~subc.ir.lowering.lpm_form`), those to the dead state included.

These are the forms a compile of the same rules gives (:mod:`subc.ir.lowering`; checked
entry for entry by ``tests/test_live_lowering.py``).  The action is ``subc_set_state(child's
state)``, except on the last field, where it is the leaf's delivery: ``subc_fwd(port)``,
``subc_mcast(group)`` with one multicast group per set of ports (made before the first entry that
uses it, deleted after the last), or in a multi-message program ``subc_msg_fwd(port bitmap)``; a
leaf without ports has the spec's default action (the tables' default).  A subscriber number of
the diagram *is* a switch port here.

Root slots (level-0 states 1..ROOT_SLOTS) are rewritten by difference with what they hold;
:meth:`LiveEntries.switch` is the one MODIFY of ``subc_root``'s default action.  Buffered writes
go out in :meth:`LiveEntries.flush`: new multicast groups, then entries (INSERT, MODIFY,
DELETE), then groups no entry uses; every write is to a state no packet reaches (new nodes, a
root slot that is not live, freed nodes after their grace period).  Before writing, the table
sizes of the P4Info are checked, so a change that does not fit fails whole (SubcError) and the
broker reverts it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ...ir.live_nodes import Node
from ...errors import SubcError
from ...ir import lowering
from ...ir.live_nodes import exact_miss, is_dead
from ...backends.p4.entries_doc import ActionCall, EntriesDoc, Entry, Match
from ...backends.p4.tables import FALLBACK_PRIORITY, SPECIFIC_PRIORITY
from .requests import entry_update, group_update, slot_updates

MAX_GROUP = 0xFFFF


@dataclass
class Level:
    """The tables of one field: ``kind`` (match kind), ``width`` in bits, ``stage`` and ``miss``
    table names (one per message slot), their default actions ((name, params) tuples)."""

    kind: str
    width: int
    stage: list[str]
    miss: list[str]
    stage_default: tuple
    miss_default: tuple | None


@dataclass
class Inherited:
    """What the switch held when a restarted daemon took over: the live root slot, the states
    per level that have entries, and those entries (table name -> entries.json form)."""

    live_slot: int
    states: dict[int, set[int]] = field(default_factory=dict)
    entries: list[tuple[str, Entry]] = field(default_factory=list)


def _action(a: ActionCall) -> tuple:
    return a.action, tuple(sorted(a.params.items()))


class LiveEntries:
    """Writes delivery nodes into a serve program's tables (see the module docstring).

    ``session``: a :class:`~.session.Session` on the switch; ``doc``: the program's
    ``entries.json``; ``root_slots``: root versions (``serve.json``)."""

    def __init__(self, session, doc: EntriesDoc, root_slots: int):
        self.s, self.doc, self.root_slots = session, doc, root_slots
        self.order = doc.field_order
        self.n = len(self.order)
        self.mm = doc.messages
        self.bit = {p: 1 << j for j, p in enumerate(self.mm.ports)} if self.mm else {}
        tables = {t.name: t for t in doc.tables}
        by_field: dict[str | None, dict[str, list]] = {}
        for t in doc.tables:
            if t.role in ("stage", "miss"):
                by_field.setdefault(t.field, {"stage": [], "miss": []})[t.role].append(t.name)
        self.levels: list[Level] = []
        for f in self.order:
            names = by_field.get(f)
            if not names or not names["stage"]:
                raise SubcError(f"the program has no table for {f}: compile it with subc serve-program")
            st = tables[names["stage"][0]]
            kind = st.keys[1].match_kind
            if kind not in ("range", "exact", "lpm"):
                raise SubcError(f"{st.name} matches {f} by {kind}: not a program of subc serve-program")
            miss_default = _action(tables[names["miss"][0]].default_action) if names["miss"] else None
            self.levels.append(
                Level(
                    kind,
                    st.keys[1].bitwidth,
                    names["stage"],
                    names["miss"],
                    _action(st.default_action),
                    miss_default,
                )
            )
        last = self.levels[-1]
        leaf_default = last.miss_default if last.kind == "exact" else last.stage_default
        if leaf_default is None:
            raise SubcError(f"the program has no miss table for {self.order[-1]}: compile it with subc serve-program")
        self.leaf_default: tuple = leaf_default
        self.sizes = {t.preamble.name: t.size for t in session.p4info.tables}
        self.held: Counter = Counter()  # entries per table
        self.slot_entries: dict[int, dict] = {}  # root slot -> {(role, key): action}
        self.slot_node: dict[int, Node] = {}  # root slot -> the root whose entries it holds (if one does)
        self.groups: dict[tuple[int, ...], int] = {}  # port set -> group id
        self.group_refs: Counter = Counter()
        self.free_groups: list[int] = []
        self.next_group = 1
        # (INSERT|MODIFY|DELETE, level, state, role, key, new action, old action)
        self._ops: list[tuple] = []
        self.written: set[tuple[int, int]] = set()  # (level, state) of the nodes below the root on the switch
        self.writes = 0
        self._slots_before: dict[int, dict] = {}  # root slot -> its entries before the buffered writes
        self._root_memo: tuple[Node, dict] | None = None  # (root, its entries) until a node is written or cleared

    # -- actions ------------------------------------------------------------------------------

    def _act(self, lv: int, child: Node) -> tuple:
        """The action of an entry leading to ``child`` (several ports: ``("subc_mcast", (("ports",
        ports),))`` until :meth:`flush` gives the set its group)."""
        if lv < self.n - 1:
            return "subc_set_state", (("next_state", child.state),)
        ports = tuple(child.runs)
        if not ports:
            return self.leaf_default
        if self.mm:
            bitmap = 0
            for p in ports:
                if p not in self.bit:
                    raise SubcError(f"port {p} is not a subscriber port of the program ({list(self.mm.ports)})")
                bitmap |= self.bit[p]
            return "subc_msg_fwd", (("ports", bitmap),)
        if len(ports) == 1:
            return "subc_fwd", (("port", ports[0]),)
        return "subc_mcast", (("ports", ports),)

    def _resolve(self, action: tuple, new_groups: list) -> tuple:
        """``action`` with a port set's multicast group (one more reference to it)."""
        if action[0] != "subc_mcast":
            return action
        ports = action[1][0][1]
        g = self.groups.get(ports)
        if g is None:
            if self.free_groups:
                g = self.free_groups.pop()
            elif self.next_group <= MAX_GROUP:
                g, self.next_group = self.next_group, self.next_group + 1
            else:
                raise SubcError("every multicast group id is in use")
            self.groups[ports] = g
            new_groups.append((g, ports))
        self.group_refs[g] += 1
        return "subc_mcast", (("group", g),)

    def _unref(self, action: tuple, dead: list) -> None:
        if action[0] != "subc_mcast":
            return
        ports = action[1][0][1]
        g = self.groups[ports]
        self.group_refs[g] -= 1
        if not self.group_refs[g]:
            del self.group_refs[g], self.groups[ports]
            dead.append(g)

    # -- entries of a node --------------------------------------------------------------------

    def entries_of(self, node: Node) -> dict:
        """{(role, key): action} of ``node`` (any state: keys hold no state)."""
        lv, L = node.level, self.levels[node.level]
        out: dict[tuple, tuple] = {}
        if L.kind == "range":
            runs, fb = lowering.range_form(node.runs, is_dead)
            for lo, hi, c in runs:
                out[("stage", ("range", lo, hi, SPECIFIC_PRIORITY))] = self._act(lv, c)
            if not is_dead(fb):
                out[("stage", ("range", 0, (1 << L.width) - 1, FALLBACK_PRIORITY))] = self._act(lv, fb)
        elif L.kind == "exact":
            miss = exact_miss(node)
            for v, c in lowering.exact_values(node.runs, miss):
                out[("stage", ("exact", v))] = self._act(lv, c)
            a = self._act(lv, miss)
            if a != L.miss_default:
                out[("miss", ("miss",))] = a
        else:  # every entry counts, those to the dead state too: they override an enclosing prefix
            for v, plen, c in lowering.lpm_form(node.runs, L.width, is_dead):
                out[("stage", ("lpm", v, plen))] = self._act(lv, c)
        return out

    def write(self, node: Node, state: int | None = None) -> None:
        """Write every entry of (new) ``node`` under its state (or ``state``: a root slot)."""
        if node.level == self.n:
            return  # a leaf: its delivery is the action of its parents' entries
        self._root_memo = None
        state = node.state if state is None else state
        for (role, key), a in self.entries_of(node).items():
            self._ops.append(("INSERT", node.level, state, role, key, a, None))

    def clear(self, node: Node, state: int | None = None) -> None:
        """Delete the entries of freed ``node`` (under its state or ``state``); nothing when they
        were never written (a change that did not fit)."""
        if node.level == self.n:
            return
        self._root_memo = None
        state = node.state if state is None else state
        if (node.level, state) not in self.written:
            return
        for (role, key), a in self.entries_of(node).items():
            self._ops.append(("DELETE", node.level, state, role, key, None, a))

    def write_root(self, slot: int, root: Node, spans: list[tuple[int, int]] | None) -> None:
        """Make root slot ``slot`` hold ``root``'s entries: the difference with what it holds.
        ``spans``: the level-0 values whose children may differ from those of the root the slot
        was last written with (None: anywhere); on an exact first field with an unchanged miss
        target only those values are compared (the work follows the change, not the root's
        size), else the whole root."""
        old = self.slot_entries.get(slot, {})
        self._slots_before.setdefault(slot, old)
        prev = self.slot_node.get(slot)
        if spans is not None and prev is not None and self.levels[0].kind == "exact":
            miss = exact_miss(root)
            if exact_miss(prev) is miss:
                self.slot_entries[slot] = self._write_spans(slot, old, prev, root, miss, spans)
                self.slot_node[slot] = root
                return
        new = self._root_entries(root)
        self._ops += self._slot_diff(slot, old, new)
        self.slot_entries[slot] = new
        self.slot_node[slot] = root

    @staticmethod
    def _slot_diff(slot: int, old: dict, new: dict, limit: int | None = None) -> list[tuple]:
        """The writes (at most ``limit``) that make root slot ``slot``, holding ``old``, hold
        ``new`` ({(role, key): action}): inserts and modifications first, then deletions."""
        ops: list[tuple] = []
        for k, a in new.items():
            b = old.get(k)
            if b != a:
                ops.append(("INSERT" if b is None else "MODIFY", 0, slot, k[0], k[1], a, b))
                if len(ops) == limit:
                    return ops
        for k, b in old.items():
            if k not in new:
                ops.append(("DELETE", 0, slot, k[0], k[1], None, b))
                if len(ops) == limit:
                    return ops
        return ops

    def _write_spans(self, slot: int, old: dict, prev: Node, root: Node, miss: Node, spans) -> dict:
        """The writes that make exact root slot ``slot``, holding ``old`` (``prev``'s entries),
        hold ``root``'s within ``spans`` (the same miss target ``miss``); returns what it then
        holds."""
        held = dict(old)
        ops = self._ops
        for lo, hi in spans:
            new = {
                ("stage", ("exact", v)): self._act(0, c)
                for v, c in lowering.exact_values(root.between(lo, hi), miss, lo, hi)
            }
            for v, _ in lowering.exact_values(prev.between(lo, hi), miss, lo, hi):
                k = ("stage", ("exact", v))
                if k not in new:
                    b = held.pop(k, None)
                    if b is not None:
                        ops.append(("DELETE", 0, slot, "stage", k[1], None, b))
            for k, a in new.items():
                b = held.get(k)
                if b != a:
                    ops.append(("INSERT" if b is None else "MODIFY", 0, slot, "stage", k[1], a, b))
                    held[k] = a
        return held

    def _root_entries(self, root: Node) -> dict:
        """:meth:`entries_of` ``root``, kept while no node is written or cleared (the refreshes
        of free slots between two changes compare with the same root)."""
        memo = self._root_memo
        if memo is None or memo[0] is not root:
            memo = self._root_memo = (root, self.entries_of(root))
        return memo[1]

    def refresh_root(self, slot: int, root: Node, limit: int) -> int:
        """Buffer at most ``limit`` of the writes that make root slot ``slot`` (not live) hold
        ``root``'s entries, the slot then holding what they leave it (:meth:`write_root` compares
        with that).  Returns the writes buffered (0: it holds ``root``'s entries)."""
        old = self.slot_entries.get(slot, {})
        ops = self._slot_diff(slot, old, self._root_entries(root), max(limit, 1))
        if ops:
            self._slots_before.setdefault(slot, old)
            self.slot_node.pop(slot, None)  # it holds part of the way to root: compared whole next time
            held = dict(old)
            for op, _, _, role, key, a, _ in ops:
                if op == "DELETE":
                    del held[(role, key)]
                else:
                    held[(role, key)] = a
            self.slot_entries[slot] = held
            self._ops += ops
        return len(ops)

    # -- writing ------------------------------------------------------------------------------

    def _entry(self, role: str, state: int, key: tuple, action: tuple) -> Entry:
        match: tuple[Match, ...]
        if role == "miss":
            match = (Match("exact", state),)
        elif key[0] == "exact":
            match = (Match("exact", state), Match("exact", key[1]))
        else:  # range (lo, hi) or lpm (value, prefix length)
            match = (Match("exact", state), Match(key[0], key[1], key[2]))
        return Entry(match, key[3] if key[0] == "range" else None, action[0], dict(action[1]))

    def flush(self) -> None:
        """Write the buffered changes (see the module docstring).  SubcError when a table would
        overflow (nothing written, nothing kept) or the switch rejects an update: then the
        updates it did apply are undone (:meth:`_undo`), so the switch and this writer hold what
        they held before the call."""
        from p4.v1 import p4runtime_pb2 as pr

        ops, self._ops = self._ops, []
        slots_before, self._slots_before = self._slots_before, {}
        if not ops:
            return
        delta: Counter = Counter()
        for op, lv, _, role, _, _, _ in ops:
            d = {"INSERT": 1, "DELETE": -1}.get(op, 0)
            L = self.levels[lv]
            for name in L.stage if role == "stage" else L.miss:
                delta[name] += d
        for name, d in delta.items():
            if self.held[name] + d > self.sizes.get(name, 0):
                self.slot_entries.update(slots_before)
                raise SubcError(
                    f"table {name} has room for {self.sizes.get(name, 0)} entries; the change needs "
                    f"{self.held[name] + d}"
                )
        saved = (dict(self.groups), Counter(self.group_refs), list(self.free_groups), self.next_group)
        old_group = saved[0]  # how the old actions name their groups
        new_groups: list = []
        dead: list = []
        kinds = {"INSERT": pr.Update.INSERT, "MODIFY": pr.Update.MODIFY, "DELETE": pr.Update.DELETE}
        undo_kind = {"INSERT": "DELETE", "MODIFY": "MODIFY", "DELETE": "INSERT"}
        entries, inverse, marked = [], [], []
        for op, lv, state, role, key, a, b in ops:
            L = self.levels[lv]
            if a is not None:
                a = self._resolve(a, new_groups)
            if b is not None:
                self._unref(b, dead)
                b = self._named(b, old_group)
            names = L.stage if role == "stage" else L.miss
            # a DELETE names no action: the entry's other one stands in (one the table lists)
            entries += self._updates(kinds[op], names, self._entry(role, state, key, a or b))
            # built only if the switch rejects the change (:meth:`_undo`): half the messages
            undo = (kinds[undo_kind[op]], self._entry(role, state, key, b or a))
            inverse += [(undo[0], name, undo[1]) for name in names]
            if lv and op != "MODIFY":
                mark = (lv, state) not in self.written if op == "INSERT" else (lv, state) in self.written
                if mark:
                    marked.append((lv, state))
                    (self.written.add if op == "INSERT" else self.written.discard)((lv, state))
        old_ports = {g: ports for ports, g in saved[0].items()}
        updates = [group_update(pr.Update.INSERT, g, list(ports)) for g, ports in new_groups]
        inverse = [group_update(pr.Update.DELETE, g) for g, _ in new_groups] + inverse
        updates += entries
        updates += [group_update(pr.Update.DELETE, g) for g in dead]
        inverse += [group_update(pr.Update.INSERT, g, list(old_ports[g])) for g in dead]
        try:
            self.s.write(updates)
        except SubcError as e:
            self.groups, self.group_refs, self.free_groups, self.next_group = saved
            for lv_state in marked:  # toggled back
                if lv_state in self.written:
                    self.written.discard(lv_state)
                else:
                    self.written.add(lv_state)
            self.slot_entries.update(slots_before)
            self._undo(e, inverse)
            raise
        self.writes += len(updates)
        for name, d in delta.items():
            self.held[name] += d
        self.free_groups.extend(dead)

    def _updates(self, kind, names: list[str], e: Entry) -> list:
        """One update of ``kind`` of entry ``e`` per table of ``names`` (the message slots'
        copies; DELETEs without action), serialized (:func:`~.requests.slot_updates`)."""
        from p4.v1 import p4runtime_pb2 as pr

        return slot_updates(self.s.index, kind, names, e, action=kind != pr.Update.DELETE)

    @staticmethod
    def _named(action: tuple, group_of: dict) -> tuple:
        """``action`` with a port set named by the group ``group_of`` gives it."""
        if action[0] != "subc_mcast":
            return action
        return "subc_mcast", (("group", group_of[action[1][0][1]]),)

    def _undo(self, e: SubcError, inverse: list) -> None:
        """Write the inverses of the updates the switch applied before rejecting ``e``'s (last
        applied first); ``inverse``: per update, its inverse (an Update, or (kind, table, entry)
        to build).  SubcError when the switch did not say which it applied or rejects an
        inverse: the switch then holds part of a change until a restarted daemon adopts it."""
        applied = getattr(e, "applied", None)
        if applied is None:
            raise SubcError(
                f"{e.message}; the switch did not say which updates it applied: restart the daemon to "
                "take the switch over again"
            ) from None
        from p4.v1 import p4runtime_pb2 as pr

        def built(u):
            if not isinstance(u, tuple):
                return u
            kind, name, entry = u
            return entry_update(self.s.index, kind, name, entry, action=kind != pr.Update.DELETE)

        try:
            self.s.write([built(inverse[k]) for k in reversed(applied)])
        except SubcError as again:
            raise SubcError(
                f"{e.message}; undoing the {len(applied)} applied updates failed too ({again.message}): "
                "restart the daemon to take the switch over again"
            ) from None

    def switch(self, slot: int) -> None:
        """Publish root slot ``slot`` (after the buffered writes): one MODIFY of the root's
        default action."""
        from .control import root_update

        self.flush()
        self.s.write([root_update(self.s.index, self.doc, slot)])
        self.writes += 1
