"""``subc load|update|verify|stats --p4runtime``: a compiled output directory on a switch.

* :func:`load`: set the pipeline when asked (``p4info.txtpb`` and the target's device config),
  then write the multicast groups, every entry with a copy of the root's under a spare state
  (:func:`~.plan.with_spare_root`), and last the root (the default action of ``subc_root``,
  entries.json ``root``).
* :func:`update`: read what the switch holds, plan the generation-safe difference
  (:func:`~.plan.plan_update`) and write it phase by phase, the root switch alone in its request,
  the deletions after ``grace`` seconds (P4Runtime says nothing of when the packets that read the
  old root have left the ingress pipeline: microseconds on BMv2 and on an ASIC; the default
  leaves a wide margin).
* :func:`verify`: read every entry back and compare with ``entries.json`` (up to the numbering
  of states and groups an update chose: :func:`~.compare.compare`).
* :func:`stats`: entries per table and the counters' cells.

All raise :class:`~subc.errors.SubcError` with what failed (see :mod:`.session`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...backends.p4.entries_doc import EntriesDoc, Entry
from ...backends.p4.p4info_shape import program_shape, shape_digest
from ...compiler.gcpause import paused_gc
from ...errors import SubcError
from .plan import UpdatePlan, plan_update, with_spare_root
from .readback import decode_action, switch_document
from .record import (
    SwitchRecord,
    forget_record,
    holding_differences,
    program_digest,
    read_record,
    record_path,
    write_record,
)
from .requests import P4InfoIndex, entry_update, group_update, insert_updates, read_p4info
from .session import Session, WriteRejected
from ...backends.p4.state_index import StateIndex, read_states

GRACE = 0.05  # seconds between the root switch and the deletions


def read_p4info_file(out_dir: str):
    """The P4Info message of ``out_dir``'s ``p4info.txtpb``.  SubcError when it has none."""
    try:
        return read_p4info((Path(out_dir) / "p4info.txtpb").read_text())
    except FileNotFoundError:
        raise SubcError(f"{out_dir}: no p4info.txtpb: compile a whole program with --target bmv2 or tofino") from None


def read_output(out_dir: str) -> tuple[EntriesDoc, object]:
    """(entries.json, P4Info message) of a ``subc compile --target bmv2|tofino`` directory.
    SubcError when either is missing or the document is not one this subc reads."""
    d = Path(out_dir)
    try:
        raw = json.loads((d / "entries.json").read_text())
        info = read_p4info((d / "p4info.txtpb").read_text())
    except FileNotFoundError as e:
        raise SubcError(
            f"{out_dir}: no {Path(e.filename).name}: compile a whole program with --target bmv2 or tofino"
        ) from None
    if isinstance(raw, dict) and "root" not in raw:
        raise SubcError(f"{out_dir}/entries.json has no root table: recompile it with this subc")
    try:
        return EntriesDoc.from_json(raw), info
    except ValueError as e:
        raise SubcError(f"{out_dir}/entries.json: {e}") from None


def read_compiled(out_dir: str) -> tuple[StateIndex, str | None]:
    """(the rule set by state, the shape digest of its P4Info or None) of a ``subc compile
    --target bmv2|tofino`` directory: its ``states.jsonl`` (written beside entries.json,
    :func:`~subc.backends.p4.state_index.states_file`) when it is there and entries.json has the
    size it records, else entries.json's (indexed here).  SubcError as :func:`read_output`."""
    got = read_states(out_dir)
    if got is None:
        doc, _ = read_output(out_dir)
        return StateIndex.from_doc(doc, spares=False), None
    index, header = got
    return index, header.get("program_shape")


def program_differences(switch_info, compiled_info) -> list[str]:
    """How the P4Info a switch runs differs from a compiled one, table sizes aside (a compile
    sizes tables by its own entries): tables, keys, actions and their parameters by name."""
    (sa, st), (ca, ct) = program_shape(switch_info), program_shape(compiled_info)
    out = []
    for name in sorted(set(ct) - set(st)):
        out.append(f"table {name} is not on the switch")
    for name in sorted(set(st) - set(ct)):
        out.append(f"table {name} of the switch is not in the compiled program")
    for name in sorted(set(st) & set(ct)):
        if st[name][0] != ct[name][0]:
            out.append(f"table {name} has keys {st[name][0]} on the switch, {ct[name][0]} compiled")
    for name in sorted(set(ca)):
        if name not in sa:
            out.append(f"action {name} is not on the switch")
        elif sa[name] != ca[name]:
            out.append(f"action {name} has parameters {sa[name]} on the switch, {ca[name]} compiled")
    return out


def same_program(s: Session, info, out_dir: str) -> None:
    """SubcError unless the switch of ``s`` runs the program of P4Info ``info`` (sizes aside;
    ``info`` None: ``out_dir``'s p4info.txtpb)."""
    if info is None:
        info = read_p4info_file(out_dir)
    diff = program_differences(s.p4info, info)
    if diff:
        raise SubcError(
            f"{s.addr} runs another program than {out_dir}: "
            + "; ".join(diff[:5])
            + ("" if len(diff) <= 5 else f" (and {len(diff) - 5} more)")
            + ": set it with --config (BMv2: the JSON p4c-bm2-ss writes for subc.p4)"
        )


def root_update(index: P4InfoIndex, doc: EntriesDoc, root: int):
    """The MODIFY of the root table's default action that makes ``root`` the root state."""
    from p4.v1 import p4runtime_pb2 as pr

    r = doc.root
    u = entry_update(index, pr.Update.MODIFY, r.table, Entry((), None, r.action, {r.param: root}))
    u.entity.table_entry.is_default_action = True
    return u


@dataclass
class Written:
    """What a load or update wrote: updates per phase, seconds per phase."""

    phases: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    plan: UpdatePlan | None = None
    #: where the update learnt what the switch held: "record", or why it read the switch
    source: str = "record"
    #: seconds from the start of the update to the root write's acknowledgement (the new rule
    #: set classifies every packet that starts after it)
    live_s: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.phases.values())


def _phase(w: Written, s: Session, name: str, updates: list) -> None:
    t = time.perf_counter()
    w.phases[name] = s.write(updates)
    w.seconds[name] = time.perf_counter() - t


def load(
    out_dir: str,
    addr: str,
    device_id: int = 0,
    election_id: tuple[int, int] = (0, 1),
    config: str | None = None,
    record_dir: str | None = None,
) -> Written:
    """Load ``out_dir`` on the switch at ``addr`` (with the spare root, room permitting); with
    ``config`` (the device config, BMv2's JSON) set the forwarding pipeline from it and
    ``p4info.txtpb`` first; then write the switch's record in ``record_dir`` (:mod:`.record`).
    SubcError when the switch runs another program or already holds entries of its tables (use
    :func:`update`)."""
    doc, info = read_output(out_dir)
    cfg = (str(Path(out_dir) / "p4info.txtpb"), config) if config else None
    with Session(addr, device_id, election_id, cfg) as s:
        same_program(s, info, out_dir)
        ours = {t.name for t in doc.tables}
        held = sum(1 for te in s.table_entries() if s.index.table_names.get(te.table_id) in ours)
        if held:
            raise SubcError(
                f"{addr} already holds {held} entries of this program's tables: use subc update "
                "--p4runtime, or --config to start from an empty pipeline"
            )
        spared = spared_doc(s.p4info, doc)
        ups = insert_updates(spared, s.index)
        n_groups = len(doc.multicast_groups)
        path = record_path(addr, device_id, record_dir)
        forget_record(path)
        w = Written(source="load")
        _phase(w, s, "groups", ups[:n_groups])
        _phase(w, s, "entries", ups[n_groups:])
        _phase(w, s, "root", [root_update(s.index, doc, doc.initial_state)])
        t = time.perf_counter()
        write_record(path, loaded_record(addr, device_id, s.p4info, spared))
        w.seconds["record"] = time.perf_counter() - t
        return w


def loaded_record(addr: str, device_id: int, p4info, spared: EntriesDoc) -> SwitchRecord:
    """The record :func:`load` writes once the switch holds ``spared`` (:func:`spared_doc`) and
    runs the program of P4Info ``p4info``."""
    return SwitchRecord(addr, device_id, program_digest(p4info), StateIndex.from_doc(spared))


def table_sizes(p4info) -> dict[str, int]:
    """Table name -> entries it holds (0: unsized) in P4Info ``p4info``."""
    return {t.preamble.name: t.size for t in p4info.tables}


def spared_doc(p4info, doc: EntriesDoc) -> EntriesDoc:
    """What :func:`load` writes of ``doc`` on a switch running P4Info ``p4info``: ``doc`` with
    the spare root's copy (:func:`~.plan.with_spare_root`) when the tables have room for it
    (``--capacity-factor`` 2 and more); else ``doc`` (the first update then writes its whole
    root)."""
    sizes = table_sizes(p4info)
    spared = with_spare_root(doc)
    if all(not sizes.get(t.name) or len(t.entries) <= sizes[t.name] for t in spared.tables):
        return spared
    return doc


def read_switch(s: Session, skeleton: EntriesDoc) -> EntriesDoc:
    """The entries.json document of what the switch of ``s`` holds, in the shape of ``skeleton``."""
    return switch_document(
        skeleton, s.index, s.table_entries(), s.default_entry(skeleton.root.table), s.multicast_groups()
    )


def check_room(sizes: dict[str, int], old: StateIndex, plan: UpdatePlan) -> None:
    """SubcError when ``plan`` needs more entries side by side than a table holds (``sizes``:
    :func:`table_sizes`; ``old``: what the switch holds before it)."""
    have = old.table_sizes()
    adds: dict[str, int] = {}
    for t, _ in plan.inserts:
        adds[t] = adds.get(t, 0) + 1
    for t, _ in plan.spare_deletes:  # acknowledged before the inserts
        have[t] -= 1
    for t, n in adds.items():
        if sizes.get(t) and have.get(t, 0) + n > sizes[t]:
            raise SubcError(
                f"table {t} holds {sizes[t]} entries: the update needs {have.get(t, 0)} loaded and {n} new "
                "side by side; compile with a larger --capacity-factor and reload (subc load --config)"
            )


def update(
    out_dir: str,
    addr: str,
    device_id: int = 0,
    election_id: tuple[int, int] = (0, 1),
    grace: float = GRACE,
    record_dir: str | None = None,
) -> Written:
    """Make the switch at ``addr`` run ``out_dir``'s rule set with the fewest writes, no packet
    classified by a mix of the two (see the module docstring and :mod:`.plan`), planned from the
    writer's record of the switch (:mod:`.record`, in ``record_dir``) when it is there and the
    switch runs its program from its root, else from what the switch holds (read back).  A write
    the switch rejects makes the writer read the switch: an update planned from the record is
    planned again from what was read (the record may have been wrong: another controller wrote);
    a rejection of an update planned from the switch is raised (:class:`~.session.WriteRejected`)
    after the record is rewritten from the switch.  ``out_dir``'s state index
    (``states.jsonl``, :func:`read_compiled`) is read instead of its entries.json when present.

    The cycle collector is paused meanwhile (:func:`~subc.compiler.gcpause.paused_gc`): reading
    the indexes, planning and importing the session's modules (grpc, pure-Python protobuf)
    allocate objects that live until the update ends, enough to run it ~170 times (40 ms of a
    ``subc update`` process)."""
    with paused_gc():
        return _update(out_dir, addr, device_id, election_id, grace, record_dir)


def _update(
    out_dir: str, addr: str, device_id: int, election_id: tuple[int, int], grace: float, record_dir: str | None
) -> Written:
    start = time.perf_counter()
    new, shape = read_compiled(out_dir)
    doc = new.skeleton
    with Session(addr, device_id, election_id) as s:
        if shape is None or shape != shape_digest(s.p4info):
            same_program(s, None, out_dir)
        path = record_path(addr, device_id, record_dir)
        program = program_digest(s.p4info)
        t = time.perf_counter()
        old, source = _held(s, doc, path, program)
        read_s = time.perf_counter() - t
        try:
            w = _write_update(s, new, old, grace, path, start)
        except WriteRejected as e:
            if source != "record":
                write_record(path, SwitchRecord(addr, device_id, program, _read_index(s, doc)))
                raise
            # planned from the record: the switch may hold something else (another controller
            # wrote); plan again from what it holds now
            old = _read_index(s, doc)
            source = f"the switch (a write planned from the record was rejected: {e})"
            try:
                w = _write_update(s, new, old, grace, path, start)
            except WriteRejected:
                write_record(path, SwitchRecord(addr, device_id, program, _read_index(s, doc)))
                raise
        assert w.plan is not None
        w.source = source
        w.seconds["read"] = read_s
        t = time.perf_counter()
        assert w.plan.held is not None
        write_record(path, SwitchRecord(addr, device_id, program, w.plan.held))
        w.seconds["record"] = time.perf_counter() - t
        return w


def _read_index(s: Session, skeleton: EntriesDoc) -> StateIndex:
    """What the switch of ``s`` holds (read back), by state."""
    return StateIndex.from_doc(read_switch(s, skeleton))


def _held(s: Session, doc: EntriesDoc, path: Path, program: str) -> tuple[StateIndex, str]:
    """(what the switch holds, "record" or why it was read back): the record when it is of this
    switch and program and the switch's root is the record's (one read), else the switch's entries."""
    rec, why = read_record(path, s.addr, s.device_id, program)
    if rec is not None:
        _, params = decode_action(s.index, doc.root.table, s.default_entry(doc.root.table))
        if params.get(doc.root.param) == rec.index.root:
            return rec.index, "record"
        why = f"the switch's root is state {params.get(doc.root.param)}, the record's {rec.index.root}"
    return _read_index(s, doc), f"the switch ({why})"


#: an update's phases, in the order they are written, each acknowledged before the next (the
#: root switch the fourth; the last two after the grace)
PHASES = ("groups", "spare_deletes", "inserts", "root", "deletes", "group_deletes")


def phase_updates(index: P4InfoIndex, doc: EntriesDoc, plan: UpdatePlan, phase: str) -> list:
    """The ``p4.v1.Update`` messages of ``phase`` (one of :data:`PHASES`) of ``plan``, for a
    switch of P4Info ``index`` and the new rule set's skeleton ``doc`` (its root table)."""
    from p4.v1 import p4runtime_pb2 as pr

    ins, dele, mod = pr.Update.INSERT, pr.Update.DELETE, pr.Update.MODIFY
    if phase == "groups":
        return [group_update(ins, g, ports) for g, ports in plan.group_inserts]
    if phase == "spare_deletes":
        return [entry_update(index, dele, t, e) for t, e in plan.spare_deletes]
    if phase == "inserts":
        ups = ((ins, plan.inserts), (mod, plan.modifies))
        return [entry_update(index, kind, t, e) for kind, es in ups for t, e in es]
    if phase == "root":
        return [] if plan.root is None else [root_update(index, doc, plan.root)]
    if phase == "deletes":
        return [entry_update(index, dele, t, e) for t, e in plan.deletes]
    if phase == "group_deletes":
        return [group_update(dele, g) for g in plan.group_deletes]
    raise ValueError(f"no phase {phase}")


def _write_update(s: Session, new: StateIndex, old: StateIndex, grace: float, path: Path, start: float) -> Written:
    """Plan the update from ``old`` to ``new`` and write it (the record removed before the first
    write); ``start``: the update's start (``time.perf_counter``) for :attr:`Written.live_s`."""
    t = time.perf_counter()
    plan = plan_update(old, new)
    doc = new.skeleton
    check_room(table_sizes(s.p4info), old, plan)
    w = Written(plan=plan)
    w.seconds["plan"] = time.perf_counter() - t
    forget_record(path)
    for name in PHASES[:4]:
        _phase(w, s, name, phase_updates(s.index, doc, plan, name))
    w.live_s = time.perf_counter() - start
    if plan.deletes or plan.group_deletes:
        time.sleep(grace)
    for name in PHASES[4:]:
        _phase(w, s, name, phase_updates(s.index, doc, plan, name))
    return w


def verify(
    out_dir: str,
    addr: str,
    device_id: int = 0,
    election_id: tuple[int, int] = (0, 1),
    record_dir: str | None = None,
) -> list[str]:
    """Differences between what the switch at ``addr`` holds and ``out_dir``'s entries.json (empty:
    it classifies every packet as the rule set says), and between it and the writer's record in
    ``record_dir`` when there is one (a record that differs is removed: the next update reads the
    switch).  Reads only (a backup session suffices)."""
    from .compare import compare  # (an update need not import it)

    doc, info = read_output(out_dir)
    with Session(addr, device_id, election_id, read_only=True) as s:
        diff = program_differences(s.p4info, info)
        if diff:
            return [f"the switch runs another program: {d}" for d in diff]
        held = read_switch(s, doc)
        out = compare(held, doc)
        path = record_path(addr, device_id, record_dir)
        rec, _ = read_record(path, addr, device_id, program_digest(s.p4info))
        if rec is not None:
            wrong = holding_differences(held, rec.index.to_doc())
            if wrong:
                forget_record(path)
                out += [f"the writer's record {path} differs from the switch (removed): {d}" for d in wrong]
        return out


def stats(addr: str, device_id: int = 0, election_id: tuple[int, int] = (0, 1)) -> dict:
    """{"tables": {name: entries}, "counters": {name: [(index, packets, bytes)]}} of the switch."""
    with Session(addr, device_id, election_id, read_only=True) as s:
        tables = {t.preamble.name: 0 for t in s.p4info.tables}
        for te in s.table_entries():
            name = s.index.table_names.get(te.table_id)
            if name is not None:
                tables[name] += 1
        names = {c.preamble.id: c.preamble.name for c in s.p4info.counters}
        counters: dict[str, list] = {n: [] for n in names.values()}
        for ce in s.counters():
            counters[names[ce.counter_id]].append((ce.index.index, ce.data.packet_count, ce.data.byte_count))
        return {"tables": tables, "counters": {n: sorted(v) for n, v in counters.items()}}
