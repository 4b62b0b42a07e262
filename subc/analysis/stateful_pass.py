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
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..lang.ast import state_predicates
from ..ir.decisions import COUNT_ATOM, decide
from ..errors import SubcError
from ..semantics.reference import default_decision
from ..semantics.stateful_reference import StatefulReference
from .evaluate import RAW, Bundle, count_rows, datagram_copies, representatives, subscriber_lists
from .reference_np import evaluate_rules
from .state_np import StateRegisters

if TYPE_CHECKING:
    from ..sim.switch import TableSimulator

#: Disagreement examples kept.
MAX_EXAMPLES = 10


@dataclass
class StatefulOutcome:
    """What the pass found: ``counts`` (:data:`~.evaluate.AGGREGATE_SCHEMA` batches of the
    classified messages), ``disagreements`` and up to :data:`MAX_EXAMPLES` ``examples``,
    ``rule_hits`` (per rule of the set, messages), ``no_match`` (classified messages no rule
    matched), ``value_classes`` (distinct class keys), ``one_by_one`` (messages the reference
    evaluated one at a time) and ``tables_one_by_one`` (True: named counters, the table simulator)."""

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


class StatefulPass:
    """The pass over one job's splits (see the module docstring) for the compiled ``res`` and its
    :class:`~.evaluate.Bundle`; ``traces``: the file names, for examples.  Feed each split with
    :meth:`split` in order, then :meth:`finish`."""

    def __init__(self, res, bundle: Bundle, traces: list[str]):
        self.res, self.bundle, self.traces = res, bundle, traces
        self.tables = bundle.tables
        state = self.tables.state_doc
        assert state is not None  # the rules compare state: the tables' document has its state section
        self.simulator: TableSimulator | None
        self.registers: StateRegisters | None
        self.counters = bool(state.count_updates) or any(i.kind == "counter" for i in state.instances)
        if self.counters:
            from ..backends.p4.entries import entries_doc
            from ..sim.switch import TableSimulator

            self.simulator = TableSimulator(entries_doc(res.pipeline, res.target))
            self.registers = None
        else:
            self.simulator = None
            self.registers = StateRegisters(state, self.tables.masks)
        #: the rules that touch state (a comparison on state or a counter update), evaluated one
        #: message at a time, and the others, evaluated once per value class
        self.state_rules = [
            r for r in res.rules if state_predicates(r.condition) or any(a[0] == COUNT_ATOM for a in r.atoms())
        ]
        touching = {r.index for r in self.state_rules}
        self.other_rules = [r for r in res.rules if r.index not in touching]
        self.reference = StatefulReference(self.state_rules, res.spec)
        self.default = default_decision(res.spec)
        #: class key -> (the state rules whose stateless part its messages match, in rule order: the
        #: message is evaluated one by one when there are any; the other rules' decision code, their
        #: atoms, how many of them matched)
        self.keys: dict[int, tuple[tuple, int, frozenset, int]] = {}
        self.key_counts: Counter = Counter()  # messages per class key, for the other rules' hits
        self.rule_hits = np.zeros(len(res.rules), np.int64)  # the outcome's
        self.out = StatefulOutcome(rule_hits=self.rule_hits, tables_one_by_one=self.counters)

    # -- reference -------------------------------------------------------------------------------
    def _classify_keys(self, keys: np.ndarray) -> None:
        """The other rules on the new class keys of ``keys``, and whether a message of the key can
        touch state (it matches some state rule's stateless part: see the module docstring)."""
        new = np.array(sorted({int(k) for k in keys} - set(self.keys)), dtype=np.int64)
        if not len(new):
            return
        reps = representatives(self.bundle.classes, new)
        ref = evaluate_rules(self.other_rules, self.res.spec, reps, np.ones(len(new), np.int64))
        for t, k in enumerate(new):
            packet = {f: int(v[t]) for f, v in reps.items()}
            relevant = tuple(r for r in self.state_rules if self.reference.relevant(r, packet))
            self.keys[int(k)] = (
                relevant,
                self.tables.code_of(ref.decisions[t]),
                ref.atoms(t),
                int(ref.matched_rules[t]),
            )

    def _reference(self, cols: dict[str, np.ndarray], keys: np.ndarray, arrival: np.ndarray, where) -> np.ndarray:
        """The reference decision code per message of a split."""
        self._classify_keys(keys)
        n = len(keys)
        info = [self.keys[int(k)] for k in keys]
        codes = np.array([c for _, c, _, _ in info], dtype=np.int64) if n else np.zeros(0, np.int64)
        one = np.array([bool(o) for o, _, _, _ in info], dtype=bool) if n else np.zeros(0, bool)
        for k, c in Counter(int(k) for k in keys).items():
            self.key_counts[k] += c
        self.out.no_match += sum(1 for o, _, _, m in info if not o and m == 0)
        fields = list(cols)
        ref = self.reference
        for i in np.flatnonzero(one):
            packet = {f: int(cols[f][i]) for f in fields}
            t = ref.message_time(packet, int(arrival[i]) if arrival[i] >= 0 else None, f"{where(i)}: ")
            candidates, _, atoms, others = info[i]
            matched = ref.matched(packet, t, candidates)
            for r in matched:
                self.rule_hits[r.index] += 1
                atoms = atoms | r.atoms()
            if not matched and not others:
                self.out.no_match += 1
            codes[i] = self.tables.code_of(decide(atoms, self.default))
        self.out.one_by_one += int(one.sum())
        return codes

    # -- tables ----------------------------------------------------------------------------------
    def _tables(self, cols: dict[str, np.ndarray], arrival: np.ndarray, where) -> np.ndarray:
        """The tables' decision code per message of a split, the registers carried on."""
        t = self.tables
        if self.simulator is not None:
            fields = list(cols)
            codes = np.zeros(len(arrival), np.int64)
            for i in range(len(arrival)):
                packet = {f: int(cols[f][i]) for f in fields}
                try:
                    d = self.simulator.process(packet, arrival_ns=int(arrival[i]) if arrival[i] >= 0 else None)
                except ValueError as e:
                    raise SubcError(f"{where(i)}: {e}") from None
                codes[i] = t.code_of(d)
            return codes
        head = t.run(cols, t.head_steps)
        assert self.registers is not None  # without the simulator: the registers
        try:
            values = self.registers.step(head.mask, cols, arrival)
        except ValueError as e:
            raise SubcError(f"{where(0)}: {e}") from None
        tail = t.run(cols, t.tail_steps, meta=values, state=head.state, code=head.code)
        return np.where(tail.result >= 0, tail.result, np.where(head.result >= 0, head.result, t.default_code))

    # -- one split -------------------------------------------------------------------------------
    def split(self, i: int, staging: Path, final: Path) -> None:
        """Run split ``i``, whose staging part is ``staging`` (a parquet file written by
        :func:`~.evaluate.process_split`), write its final part to ``final`` (atomically) and
        remove the staging part.  Raises SubcError for a message without the time its windows need,
        or conflicting actions."""
        import pyarrow.parquet as pq

        table = pq.read_table(staging)
        n = table.num_rows
        cols = {f: table.column(RAW + f).to_numpy().astype(np.uint64) for f in self.bundle.fields}
        keys = table.column("value_class").to_numpy().astype(np.int64)
        arrival = table.column("subc:arrival_ns").to_numpy().astype(np.int64)
        positions = table.column("position").to_numpy()
        indexes = table.column("index").to_numpy()
        sp = self.bundle.splits[i]

        def where(k: int) -> str:
            if sp.kind == "pcap":
                return f"{sp.path}: frame {int(positions[k])} message {int(indexes[k])}"
            return f"{sp.path}: byte offset {int(positions[k])}"

        codes = self._tables(cols, arrival, where) if n else np.zeros(0, np.int64)
        ref = self._reference(cols, keys, arrival, where) if n else np.zeros(0, np.int64)
        bad = np.flatnonzero(codes != ref)
        self.out.disagreements += len(bad)
        for k in bad[: max(0, MAX_EXAMPLES - len(self.out.examples))]:
            self.out.examples.append(
                {
                    "file": sp.path,
                    "position": int(positions[k]),
                    "index": int(indexes[k]),
                    "reference": str(self.tables.decisions[ref[k]]),
                    "tables": str(self.tables.decisions[codes[k]]),
                }
            )
        self.out.counts.append(
            count_rows(
                keys,
                codes,
                table.column("subc:type_key").to_numpy(),
                codes,
                table.column("subc:second").to_numpy(),
                table.column("length").to_numpy(),
                table.column("subc:zero_length").to_numpy(zero_copy_only=False),
            )
        )
        ports = [d.ports for d in self.tables.decisions]
        self.out.copies.update(datagram_copies(positions, codes, ports))
        keep = [c for c in table.column_names if not c.startswith("subc:")]
        out = table.select(keep)
        out = out.set_column(out.column_names.index("subscribers"), "subscribers", subscriber_lists(codes, ports))
        out = out.set_column(out.column_names.index("decision"), "decision", pa.array(codes.astype(np.int32)))
        tmp = final.parent / f".{final.name}.{os.getpid()}"
        pq.write_table(out, tmp)
        os.replace(tmp, final)
        staging.unlink()

    def finish(self) -> StatefulOutcome:
        """The outcome, with the other rules' hits (by value class) added."""
        if self.key_counts:
            ks = np.array(sorted(self.key_counts), dtype=np.int64)
            counts = np.array([self.key_counts[int(k)] for k in ks], dtype=np.int64)
            ref = evaluate_rules(self.other_rules, self.res.spec, representatives(self.bundle.classes, ks), counts)
            for r, h in zip(self.other_rules, ref.rule_hits):
                self.rule_hits[r.index] += int(h)
        self.out.value_classes = len(self.keys)
        return self.out
