"""The switch side of ``subc serve --p4runtime``: the program, the session, and a restart's takeover.

:func:`open_switch` opens a P4Runtime session (setting the pipeline when given the device
config), checks that the switch runs the program of ``--program`` (a directory of ``subc
serve-program``), writes its fixed entries (the multi-message program's delivery tables and
multicast group of all ports) when they are missing, and returns a :class:`SwitchPlane` whose
writer (:class:`~.live_entries.LiveEntries`) the daemon's broker drives.  A switch that already
holds live entries (a previous daemon's: it kept forwarding while no daemon ran) is *adopted*:
its live root slot and every state with entries stay in use until the new daemon's first change
has switched away from them and a grace period has passed (:meth:`SwitchPlane.inherit`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ...backends.p4.entries_doc import EntriesDoc
from ...errors import SubcError
from .control import read_output, root_update, same_program
from .live_entries import Inherited, LiveEntries
from .readback import decode_action, decode_entry
from .requests import entry_update, group_update
from .session import Session

LEAF_STATES = 1 << 24  # the diagram's leaves have no entries of their own on a switch


@dataclass
class SwitchPlane:
    """A switch running a serve program: ``session``, ``doc`` (its entries.json), ``serve``
    (serve.json), ``writer``, whether it was ``adopted`` (held a previous daemon's entries),
    ``grace_s`` (seconds between a root switch and freeing what only the old root reached)."""

    session: Session
    doc: EntriesDoc
    serve: dict
    writer: LiveEntries
    adopted: bool
    grace_s: float

    @property
    def ports(self) -> list[int]:
        return self.serve["ports"]

    def stage_caps(self) -> list[int]:
        """States per level 1..n of the live diagram (the state field's values but 0)."""
        top = (1 << self.doc.state_width) - 1
        return [top] * (len(self.doc.field_order) - 1) + [LEAF_STATES]

    def grace(self) -> None:
        """Wait out the packets that may still read an old root (P4Runtime gives no signal)."""
        time.sleep(self.grace_s)

    def inherit(self) -> Inherited:
        """Read the live entries a previous daemon left: the live root slot's and every state's
        below the root are kept (counted in the writer's table fill) until
        :meth:`release_inherited`; other root slots' entries are deleted now."""
        from p4.v1 import p4runtime_pb2 as pr

        s, w = self.session, self.writer
        rt = self.doc.root.table
        _, params = decode_action(s.index, rt, s.default_entry(rt))
        live = params.get(self.doc.root.param, 0)
        inh = Inherited(live, {lv: set() for lv in range(w.n + 1)})
        level_of = {}
        for lv, L in enumerate(w.levels):
            for table in L.stage + L.miss:
                level_of[table] = lv
        drop = []
        for te in s.table_entries():
            name = s.index.table_names.get(te.table_id)
            if name is None or name not in level_of:
                continue
            _, e = decode_entry(s.index, te)
            lv, state = level_of[name], e.match[0].a
            if lv == 0 and state != live:
                drop.append(pr.Update(type=pr.Update.DELETE, entity=pr.Entity(table_entry=te)))
                continue
            inh.entries.append((name, e))
            inh.states[lv].add(state)
            w.held[name] += 1
        if drop:
            s.write(drop)
        inh.states[0].discard(0)
        used = {g.multicast_group_id for g in s.multicast_groups()}
        w.next_group = max([w.next_group, *(g + 1 for g in used)])
        return inh

    def release_inherited(self, inh: Inherited) -> None:
        """Delete the inherited entries (the root was switched away from them and a grace period
        has passed), then the multicast groups nothing uses any more."""
        from p4.v1 import p4runtime_pb2 as pr

        s, w = self.session, self.writer
        ups = []
        for name, e in inh.entries:
            ups.append(entry_update(s.index, pr.Update.DELETE, name, e, action=False))
            w.held[name] -= 1
        keep = set(w.groups.values()) | {g for g, _ in self._fixed_groups()}
        for g in s.multicast_groups():
            if g.multicast_group_id not in keep:
                ups.append(group_update(pr.Update.DELETE, g.multicast_group_id))
        if ups:
            s.write(ups)
        inh.entries.clear()

    def _fixed_groups(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """The multi-message program's one group of every subscriber port (none otherwise)."""
        return self.doc.multicast_groups if self.doc.messages else ()

    def close(self) -> None:
        self.session.close()


def open_switch(
    program_dir: str,
    addr: str,
    device_id: int = 0,
    election_id: tuple[int, int] = (0, 1),
    config: str | None = None,
    grace_s: float = 0.05,
) -> SwitchPlane:
    """Open the switch at ``addr`` for ``subc serve`` (see the module docstring).  SubcError when
    ``program_dir`` is not a ``subc serve-program`` directory, the switch is unreachable or runs
    another program, or the switch refuses a write."""
    from p4.v1 import p4runtime_pb2 as pr

    doc, info = read_output(program_dir)
    try:
        serve = json.loads((Path(program_dir) / "serve.json").read_text())
    except FileNotFoundError:
        raise SubcError(f"{program_dir} has no serve.json: make the program with subc serve-program") from None
    cfg = (str(Path(program_dir) / "p4info.txtpb"), config) if config else None
    s = Session(addr, device_id, election_id, cfg)
    try:
        same_program(s, info, program_dir)
        writer = LiveEntries(s, doc, serve["root_slots"])
        held: dict[str | None, int] = {}  # None: a table the P4Info lacks
        for te in s.table_entries():
            name = s.index.table_names.get(te.table_id)
            held[name] = held.get(name, 0) + 1
        live_tables = {n for L in writer.levels for n in L.stage + L.miss}
        adopted = any(held.get(n) for n in live_tables)
        ups = []
        groups = {g.multicast_group_id for g in s.multicast_groups()}
        for g, ports in doc.multicast_groups if doc.messages else ():
            if g not in groups:
                ups.append(group_update(pr.Update.INSERT, g, ports))
            writer.next_group = max(writer.next_group, g + 1)
        for t in doc.tables:
            if t.name in live_tables or held.get(t.name):
                continue
            ups += [entry_update(s.index, pr.Update.INSERT, t.name, e) for e in t.entries]
        if not adopted:
            ups.append(root_update(s.index, doc, 0))  # nothing is delivered until the first change
        if ups:
            s.write(ups)
    except BaseException:
        s.close()
        raise
    return SwitchPlane(s, doc, serve, writer, adopted, grace_s)
