"""The stateful pass of ``subc analyze``: every classified message, in trace order, through the
compiled tables with their registers and through the reference (docs/state.md "Stateful subscriptions").

Comparisons on state make a message's decision depend on the messages before it, so the tasks of
``subc analyze`` only decode (each writes its split's classified messages with their raw field
values, :func:`~.evaluate.stateful_columns`), and this pass, on the driver, takes the splits in
order (the traces are one stream, in the order given; a file's messages in file order):

* **tables** (the system under test): the header stages and the update table over the split's
  columns (:meth:`~.tables_np.PipelineEvaluator.run`), the registers
  (:class:`~.state_np.StateRegisters`, carried from split to split), then the state-value stages.
  A rule set with named counters (whose updates depend on each message's decision) runs message by
  message through the table simulator (:class:`~subc.sim.switch.TableSimulator`) instead;
* **reference**: the rules split in two.  The *state rules* (those with a comparison on state or a
  counter update) are evaluated on the values by
  :class:`~subc.semantics.stateful_reference.StatefulReference`, one message at a time, for the
  messages that match some state rule's stateless part (any other message matches no state rule
  and updates nothing: a rule's aggregates are updated by the messages matching its stateless part,
  a counter by the messages matching a rule that updates it).  The *other rules* are evaluated
  once per value class by :func:`~.reference_np.evaluate_rules` (which shares nothing with the
  tables); a message's decision combines the actions of both (:func:`~subc.ir.decisions.decide`).

Any message whose two decisions differ is a disagreement.  Each split's final
``messages.parquet`` part (subscribers and decision filled in) replaces its staging part.

**In parallel.**  :meth:`StatefulPass.split` does the vectorised work of a split on the driver,
in trace order (the registers of aggregates, the stateless rules, the class keys), and sets
aside what must run one message at a time: the reference's state rules on the messages that
match their stateless parts, and with named counters the table simulator on the messages whose
footprint (:mod:`.state_footprint`) is not empty; the other messages touch no register and are
decided by the vectorised tables.  :meth:`StatefulPass.finish` cuts the messages set aside into
groups that share no state (no rule's aggregates, no named counter, no register instance:
:mod:`.state_groups`), runs the groups as tasks (:mod:`.stateful_tasks`; ``runner``: a Spark job
in ``subc analyze``), each in trace order, then writes the parts.  Each register sees exactly the
messages it saw in the sequential pass, in the same order, so the decisions are the sequential
pass's; an error is the one the sequential pass would have raised first.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..lang.ast import COUNTER, And, Pred, predicates, state_predicates
from ..ir.decisions import COUNT_ATOM
from ..errors import SubcError
from ..semantics.reference import default_decision
from ..semantics.stateful_reference import StatefulReference
from .evaluate import RAW, Bundle, count_rows, datagram_copies, representatives, subscriber_lists
from .reference_np import evaluate_rules
from .state_footprint import Footprints
from .state_groups import components, pack
from .state_np import StateRegisters
from .stateful_tasks import ReferenceTask, SimulatorTask, TaskError, TaskResult, messages, run_task, where

#: Disagreement examples kept.
MAX_EXAMPLES = 10

#: ``runner(fn, tasks)``: ``[fn(t) for t in tasks]``, in any order or place (a Spark job).
Runner = Callable[[Callable[[Any], TaskResult], list], list[TaskResult]]


def local_runner(fn, tasks: list) -> list:
    """Run the tasks one after another in this process."""
    return [fn(t) for t in tasks]


@dataclass
class StatefulOutcome:
    """What the pass found: ``counts`` (:data:`~.evaluate.AGGREGATE_SCHEMA` batches of the
    classified messages), ``disagreements`` and up to :data:`MAX_EXAMPLES` ``examples``,
    ``rule_hits`` (per rule of the set, messages), ``no_match`` (classified messages no rule
    matched), ``value_classes`` (distinct class keys), ``one_by_one`` (messages the reference
    evaluated one at a time), ``tables_one_by_one`` (True: named counters, the table simulator),
    ``simulated`` (messages the table simulator ran) and ``tasks`` (groups run as tasks)."""

    counts: list[pa.RecordBatch] = field(default_factory=list)
    disagreements: int = 0
    examples: list[dict] = field(default_factory=list)
    rule_hits: np.ndarray | None = None
    no_match: int = 0
    value_classes: int = 0
    one_by_one: int = 0
    tables_one_by_one: bool = False
    #: per port (as text), the datagrams it receives (:func:`~.evaluate.datagram_copies`)
    copies: Counter = field(default_factory=Counter)
    simulated: int = 0
    tasks: int = 0


@dataclass
class _Split:
    """A split between :meth:`StatefulPass.split` and :meth:`StatefulPass.finish`: its parts,
    per classified message its class key, place and both decision codes (-1: set aside), and the
    rows set aside for the reference (``ref_rows``) and the simulator (``sim_rows``) with their
    field values and capture times."""

    i: int
    staging: Path
    final: Path
    keys: np.ndarray
    positions: np.ndarray
    indexes: np.ndarray
    tables: np.ndarray
    ref: np.ndarray
    ref_rows: np.ndarray
    sim_rows: np.ndarray
    cols: dict[str, np.ndarray]
    arrival: np.ndarray
    rows: np.ndarray  # the rows the cols and arrival hold (ref_rows and sim_rows, sorted)


class StatefulPass:
    """The pass over one job's splits (see the module docstring) for the compiled ``res`` and its
    :class:`~.evaluate.Bundle`; ``traces``: the file names, for examples; ``runner`` runs the
    tasks (default :func:`local_runner`), at most ``tasks`` of each kind.  Feed each split with
    :meth:`split` in order, then :meth:`finish`."""

    def __init__(self, res, bundle: Bundle, traces: list[str], runner: Runner | None = None, tasks: int = 1):
        self.res, self.bundle, self.traces = res, bundle, traces
        self.runner = runner or local_runner
        self.n_tasks = max(1, tasks)
        self.tables = bundle.tables
        state = self.tables.state_doc
        assert state is not None  # the rules compare state: the tables' document has its state section
        self.counters = bool(state.count_updates) or any(i.kind == "counter" for i in state.instances)
        self.registers = None if self.counters else StateRegisters(state, self.tables.masks)
        self.footprints = Footprints(self.tables) if self.counters else None
        #: the rules that touch state (a comparison on state or a counter update), evaluated one
        #: message at a time, and the others, evaluated once per value class
        self.state_rules = [
            r for r in res.rules if state_predicates(r.condition) or any(a[0] == COUNT_ATOM for a in r.atoms())
        ]
        touching = {r.index for r in self.state_rules}
        self.other_rules = [r for r in res.rules if r.index not in touching]
        self.reference = StatefulReference(self.state_rules, res.spec)
        self.gates = [_equality_gate(r.condition) for r in self.state_rules]
        self.default = default_decision(res.spec)
        #: class key -> (the state rules whose stateless part its messages match, as positions in
        #: state_rules, in rule order: the message is evaluated one by one when there are any; the
        #: other rules' decision code, the index of their atoms in base_atoms, how many matched)
        self.keys: dict[int, tuple[tuple[int, ...], int, int, int]] = {}
        self.base_atoms: list[frozenset] = []
        self._atom_ids: dict[frozenset, int] = {}
        self.key_counts: Counter = Counter()  # messages per class key, for the other rules' hits
        self.rule_hits = np.zeros(len(res.rules), np.int64)  # the outcome's
        self.out = StatefulOutcome(rule_hits=self.rule_hits, tables_one_by_one=self.counters)
        self.pending: list[_Split] = []
        #: the first error met on the driver: (split, side (0 tables, 1 reference), row, error)
        self.error: tuple[int, int, int, SubcError | TaskError] | None = None
        self.fields = self._reference_fields()

    def _reference_fields(self) -> list[str]:
        """The fields the state rules read (conditions, aggregates, counter updates, the time)."""
        out: set[str] = set()
        for r in self.state_rules:
            out |= {p.field for p in predicates(r.condition)}
            out |= {p.agg.field for p in state_predicates(r.condition) if p.agg.field is not None}
            out |= {a[2] for a in r.atoms() if a[0] == COUNT_ATOM and a[2] is not None}
        if self.res.spec.time_field is not None:
            out.add(self.res.spec.time_field)
        return [f for f in self.bundle.fields if f in out]

    # -- reference -------------------------------------------------------------------------------
    def _classify_keys(self, keys: np.ndarray) -> None:
        """The other rules on the new class keys of ``keys``, and whether a message of the key can
        touch state (it matches some state rule's stateless part: see the module docstring)."""
        new = np.array(sorted({int(k) for k in keys} - set(self.keys)), dtype=np.int64)
        if not len(new):
            return
        reps = representatives(self.bundle.classes, new)
        ref = evaluate_rules(self.other_rules, self.res.spec, reps, np.ones(len(new), np.int64))
        packets = [{f: int(v[t]) for f, v in reps.items()} for t in range(len(new))]
        relevant: list[list[int]] = [[] for _ in new]
        for j, r in enumerate(self.state_rules):
            gate = self.gates[j]  # a top-level `field == c`: the other keys cannot match the rule
            keys_in = np.flatnonzero(reps[gate[0]] == np.uint64(gate[1])) if gate is not None else range(len(new))
            for t in keys_in:
                if self.reference.relevant(r, packets[t]):
                    relevant[t].append(j)
        for t, k in enumerate(new):
            atoms = ref.atoms(t)
            self.keys[int(k)] = (
                tuple(relevant[t]),
                self.tables.code_of(ref.decisions[t]),
                self._atom_ids.setdefault(atoms, len(self._atom_ids)),
                int(ref.matched_rules[t]),
            )
        self.base_atoms = list(self._atom_ids)

    def _reference(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the reference decision code per message of a split, -1 where set aside; the rows set
        aside: messages that match some state rule's stateless part)."""
        self._classify_keys(keys)
        uniq, inv = np.unique(keys, return_inverse=True)
        info = [self.keys[int(k)] for k in uniq]
        codes = np.array([c for _, c, _, _ in info], dtype=np.int64)[inv] if len(keys) else np.zeros(0, np.int64)
        one = np.array([bool(o) for o, _, _, _ in info], dtype=bool)[inv] if len(keys) else np.zeros(0, bool)
        counts = np.bincount(np.asarray(inv).reshape(-1), minlength=len(uniq))
        for k, c in zip(uniq.tolist(), counts.tolist()):
            self.key_counts[k] += c
        none = np.array([not o and m == 0 for o, _, _, m in info], dtype=bool)
        self.out.no_match += int(counts[none].sum()) if len(uniq) else 0
        codes[one] = -1
        return codes, np.flatnonzero(one)

    # -- tables ----------------------------------------------------------------------------------
    def _tables(self, cols: dict[str, np.ndarray], arrival: np.ndarray, sp) -> tuple[np.ndarray, np.ndarray]:
        """(the tables' decision code per message of a split, -1 where set aside for the
        simulator; the rows set aside), the registers of aggregates carried on.  Raises
        SubcError for a message without the time its windows need."""
        t = self.tables
        head = t.run(cols, t.head_steps)
        if self.footprints is not None:  # named counters: the simulator for what touches registers
            doc = t.state_doc
            assert doc is not None  # the tables compare state
            if doc.time_field is None and len(arrival) and int(arrival.min()) < 0:
                k = int(np.flatnonzero(arrival < 0)[0])
                raise _RowError(k, "the rules compare state over windows of arrival time; give each message's time")
            fps = self.footprints.of_messages(head.state, head.mask)
            aside = np.array([bool(f) for f in fps], dtype=bool)
            meta = {v.key: np.zeros(len(arrival), np.uint64) for v in doc.values}  # no decision depends on them
        else:
            assert self.registers is not None  # without named counters: the registers
            try:
                meta = self.registers.step(head.mask, cols, arrival)
            except ValueError as e:
                raise _RowError(0, str(e)) from None
            aside = np.zeros(len(arrival), bool)
        tail = t.run(cols, t.tail_steps, meta=meta, state=head.state, code=head.code)
        codes = np.where(tail.result >= 0, tail.result, np.where(head.result >= 0, head.result, t.default_code))
        codes[aside] = -1
        return codes, np.flatnonzero(aside)

    # -- one split -------------------------------------------------------------------------------
    def split(self, i: int, staging: Path, final: Path) -> None:
        """Take split ``i``, whose staging part is ``staging`` (a parquet file written by
        :func:`~.evaluate.process_split`); its final part goes to ``final`` at :meth:`finish`."""
        import pyarrow.parquet as pq

        if self.error is not None:  # the job fails: the sequential pass would have stopped
            self.pending.append(_empty(i, staging, final))
            return
        sp = self.bundle.splits[i]
        table = pq.read_table(staging, columns=[RAW + f for f in self.bundle.fields] + _PLACE)
        cols = {f: table.column(RAW + f).to_numpy().astype(np.uint64) for f in self.bundle.fields}
        keys = table.column("value_class").to_numpy().astype(np.int64)
        arrival = table.column("subc:arrival_ns").to_numpy().astype(np.int64)
        positions = table.column("position").to_numpy()
        indexes = table.column("index").to_numpy()
        n = len(keys)
        try:
            tcodes, sim_rows = self._tables(cols, arrival, sp) if n else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        except _RowError as e:
            msg = f"{where(sp, int(positions[e.row]), int(indexes[e.row]))}: {e.message}"
            self.error = (i, 0, e.row, SubcError(msg))
            self.pending.append(_empty(i, staging, final))
            return
        try:
            rcodes, ref_rows = self._reference(keys) if n else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        except SubcError as e:  # conflicting actions of the other rules
            self.error = (i, 1, -1, e)
            self.pending.append(_empty(i, staging, final))
            return
        rows = np.union1d(ref_rows, sim_rows)
        self.pending.append(
            _Split(
                i, staging, final, keys, positions, indexes, tcodes, rcodes, ref_rows, sim_rows,
                {f: v[rows] for f, v in cols.items()}, arrival[rows], rows,
            )
        )  # fmt: skip

    # -- the tasks -------------------------------------------------------------------------------
    def _aside(self, which: str) -> tuple[list[_Split], np.ndarray, np.ndarray]:
        """The splits, and per message set aside for ``which`` ('ref_rows' or 'sim_rows') in trace
        order: its split's position in :attr:`pending` and its row."""
        owners, rows = [], []
        for j, ps in enumerate(self.pending):
            r = getattr(ps, which)
            owners.append(np.full(len(r), j, np.int64))
            rows.append(r)
        cat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return self.pending, (np.concatenate(owners) if owners else np.zeros(0, np.int64)), cat

    def _messages(self, owner: np.ndarray, row: np.ndarray, fields: list[str]):
        """:class:`~.stateful_tasks.Messages` of the messages (``owner``, ``row``) set aside."""
        cols: dict[str, list] = {f: [] for f in fields}
        arrival, split, pos, idx = [], [], [], []
        for j in np.unique(owner):
            ps = self.pending[j]
            r = row[owner == j]
            at = np.searchsorted(ps.rows, r)
            for f in fields:
                cols[f].append(ps.cols[f][at])
            arrival.append(ps.arrival[at])
            split.append(np.full(len(r), ps.i))
            pos.append(ps.positions[r])
            idx.append(ps.indexes[r])

        def cat(parts):
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)

        splits = {ps.i: self.bundle.splits[ps.i] for ps in self.pending}
        return messages({f: cat(v) for f, v in cols.items()}, cat(arrival), cat(split), row, cat(pos), cat(idx), splits)

    def _reference_tasks(self) -> tuple[list[ReferenceTask], list[tuple[np.ndarray, np.ndarray]]]:
        """The reference's groups as tasks, with the (owner, row) of each task's messages."""
        _, owner, row = self._aside("ref_rows")
        keys = [self.pending[j].keys[r] for j, r in zip(owner.tolist(), row.tolist())]
        info = [self.keys[int(k)] for k in keys]
        resources = [frozenset(o) for o, _, _, _ in info]
        rules = self.state_rules
        names = {p.agg.name or "" for r in rules for p in state_predicates(r.condition) if p.agg.kind == COUNTER}
        names |= {a[1] for r in self.state_rules for a in r.atoms() if a[0] == COUNT_ATOM}
        links = [[j for j, r in enumerate(self.state_rules) if _uses_counter(r, c)] for c in names]  # one counter
        comp = components(resources, [x for x in links if x])
        tasks, where_ = [], []
        for sel in pack(comp, self.n_tasks):
            used = sorted({j for k in sel for j in info[k][0]})
            local = {j: n for n, j in enumerate(used)}
            tasks.append(
                ReferenceTask(
                    [self.state_rules[j] for j in used], self.res.spec, self.reference.longest_window,
                    self._messages(owner[sel], row[sel], self.fields),
                    [tuple(local[j] for j in info[k][0]) for k in sel], [info[k][2] for k in sel],
                    self.base_atoms, [info[k][3] > 0 for k in sel], self.default,
                )
            )  # fmt: skip
            where_.append((owner[sel], row[sel]))
        self.out.one_by_one += len(row)
        return tasks, where_

    def _simulator_tasks(self) -> tuple[list[SimulatorTask], list[tuple[np.ndarray, np.ndarray]]]:
        """The simulator's groups as tasks (named counters only), as :meth:`_reference_tasks`."""
        if self.footprints is None:
            return [], []
        from ..backends.p4.entries import entries_doc

        _, owner, row = self._aside("sim_rows")
        if not len(row):
            return [], []
        fps = []
        for j in np.unique(owner):
            ps = self.pending[j]
            r = row[owner == j]
            at = np.searchsorted(ps.rows, r)
            head = self.tables.run({f: v[at] for f, v in ps.cols.items()}, self.tables.head_steps)
            fps += self.footprints.of_messages(head.state, head.mask)
        comp = components(fps)
        doc = entries_doc(self.res.pipeline, self.res.target)
        tasks, where_ = [], []
        for sel in pack(comp, self.n_tasks):
            tasks.append(SimulatorTask(doc, self._messages(owner[sel], row[sel], list(self.bundle.fields))))
            where_.append((owner[sel], row[sel]))
        self.out.simulated += len(row)
        return tasks, where_

    def _run_tasks(self) -> None:
        """Run the groups set aside and fill in their decision codes; raise the first error in
        trace order (the driver's included)."""
        ref_tasks, ref_where = self._reference_tasks()
        sim_tasks, sim_where = self._simulator_tasks()
        results = self.runner(run_task, [*ref_tasks, *sim_tasks]) if ref_tasks or sim_tasks else []
        self.out.tasks = len(results)
        sides = [1] * len(ref_tasks) + [0] * len(sim_tasks)  # the sequential pass: tables first
        errors = [(r.error.split, side, r.error.row, r.error) for side, r in zip(sides, results) if r.error is not None]
        if errors or self.error is not None:
            first = min([*errors, *([self.error] if self.error is not None else [])], key=lambda e: e[:3])
            err = first[3]
            raise err.exception() if isinstance(err, TaskError) else err
        for side, (owner, row), res in zip(sides, [*ref_where, *sim_where], results):
            codes = np.array([self.tables.code_of(d) for d in res.decisions], dtype=np.int64)
            for j in np.unique(owner):
                ps = self.pending[j]
                sel = owner == j
                target = ps.ref if side else ps.tables
                target[row[sel]] = codes[res.chosen[sel]]
            if side:
                for r, h in res.hits.items():
                    self.rule_hits[r] += h
                self.out.no_match += res.no_match

    def finish(self) -> StatefulOutcome:
        """Run the tasks, write every split's final part (removing its staging part) and return
        the outcome, with the other rules' hits (by value class) added.  Raises SubcError for a
        message without the time its windows need, or conflicting actions: the first error in
        trace order."""
        self._run_tasks()
        for ps in self.pending:
            self._write(ps)
        if self.key_counts:
            ks = np.array(sorted(self.key_counts), dtype=np.int64)
            counts = np.array([self.key_counts[int(k)] for k in ks], dtype=np.int64)
            ref = evaluate_rules(self.other_rules, self.res.spec, representatives(self.bundle.classes, ks), counts)
            for r, h in zip(self.other_rules, ref.rule_hits):
                self.rule_hits[r.index] += int(h)
        self.out.value_classes = len(self.keys)
        return self.out

    def _write(self, ps: _Split) -> None:
        """Compare a split's two decisions, count it, write its final part, remove its staging part."""
        import pyarrow.parquet as pq

        table = pq.read_table(ps.staging)
        codes, ref = ps.tables, ps.ref
        sp = self.bundle.splits[ps.i]
        bad = np.flatnonzero(codes != ref)
        self.out.disagreements += len(bad)
        for k in bad[: max(0, MAX_EXAMPLES - len(self.out.examples))]:
            self.out.examples.append(
                {
                    "file": sp.path,
                    "position": int(ps.positions[k]),
                    "index": int(ps.indexes[k]),
                    "reference": str(self.tables.decisions[ref[k]]),
                    "tables": str(self.tables.decisions[codes[k]]),
                }
            )
        self.out.counts.append(
            count_rows(
                ps.keys,
                codes,
                table.column("subc:type_key").to_numpy(),
                codes,
                table.column("subc:second").to_numpy(),
                table.column("length").to_numpy(),
                table.column("subc:zero_length").to_numpy(zero_copy_only=False),
            )
        )
        ports = [d.ports for d in self.tables.decisions]
        self.out.copies.update(datagram_copies(ps.positions, codes, ports))
        keep = [c for c in table.column_names if not c.startswith("subc:")]
        out = table.select(keep)
        out = out.set_column(out.column_names.index("subscribers"), "subscribers", subscriber_lists(codes, ports))
        out = out.set_column(out.column_names.index("decision"), "decision", pa.array(codes.astype(np.int32)))
        tmp = ps.final.parent / f".{ps.final.name}.{os.getpid()}"
        pq.write_table(out, tmp)
        os.replace(tmp, ps.final)
        ps.staging.unlink()


#: The staging columns that place a message and key it.
_PLACE = ["value_class", "subc:arrival_ns", "position", "index"]


class _RowError(Exception):
    """A tables error at row ``row`` of a split (its place is added by the caller)."""

    def __init__(self, row: int, message: str):
        super().__init__(message)
        self.row, self.message = row, message


def _empty(i: int, staging: Path, final: Path) -> _Split:
    """A split not run (the job fails at an earlier error)."""
    z = np.zeros(0, np.int64)
    return _Split(i, staging, final, z, z, z, z, z, z, z, {}, z, z)


def _uses_counter(rule, name: str) -> bool:
    """True when ``rule`` compares named counter ``name`` or updates it."""
    return any(p.agg.kind == COUNTER and p.agg.name == name for p in state_predicates(rule.condition)) or any(
        a[0] == COUNT_ATOM and a[1] == name for a in rule.atoms()
    )


def _equality_gate(cond) -> tuple[str, int] | None:
    """(field, value) of a top-level conjunct ``field == value`` of ``cond``, if any: a message
    whose field holds another value matches the condition for no truth values of its comparisons
    on state."""
    for e in cond.items if isinstance(cond, And) else (cond,):
        if isinstance(e, Pred) and e.op == "==" and len(e.operands) == 1 and e.operands[0].prefix_len is None:
            return e.field, e.operands[0].value
    return None
