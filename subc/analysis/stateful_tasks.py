"""The one-at-a-time work of the stateful pass, as tasks over independent groups of messages.

:mod:`.stateful_pass` decides what must run message by message (the reference's state rules on
the messages that match their stateless parts; with named counters, the table simulator on the
messages whose footprint is not empty) and cuts those messages into groups that share no state
(:mod:`.state_groups`).  Each group becomes a :class:`ReferenceTask` or a :class:`SimulatorTask`,
self-contained and picklable, that a Spark task (or a plain loop) runs with :func:`run_reference`
or :func:`run_simulator`: its messages in trace order, with registers that start empty, exactly as
the sequential pass would have run them.

A task stops at its first error and returns it with the message's place (split, row): the pass
raises the earliest in trace order over all tasks, as the sequential pass would have.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..backends.p4.entries_doc import EntriesDoc
from ..errors import SubcError
from ..ir.decisions import ConflictingActions, Decision, decide
from ..lang.ast import Rule
from ..semantics.stateful_reference import StatefulReference
from ..sim.switch import TableSimulator
from ..spec.model import Spec
from .splits import Split


def where(split: Split, position: int, index: int) -> str:
    """A message's place for an error: the file and its byte offset, or frame and message index."""
    if split.kind == "pcap":
        return f"{split.path}: frame {position} message {index}"
    return f"{split.path}: byte offset {position}"


@dataclass
class Messages:
    """A task's messages, in trace order: ``fields`` (field -> Python ints), ``arrival`` (capture
    time in ns, -1 unknown), and where each is: ``split`` (index into ``splits``), ``row`` (its
    row in the split's classified messages), ``position`` and ``index`` (as in messages.parquet)."""

    fields: dict[str, list[int]]
    arrival: list[int]
    split: list[int]
    row: list[int]
    position: list[int]
    index: list[int]
    splits: dict[int, Split]

    def packet(self, i: int) -> dict[str, int]:
        """Message ``i`` as ``{'header.field': value}``."""
        return {f: v[i] for f, v in self.fields.items()}

    def where(self, i: int) -> str:
        """Message ``i``'s place (:func:`where`)."""
        return where(self.splits[self.split[i]], self.position[i], self.index[i])


def messages(cols: dict[str, np.ndarray], arrival, split, row, position, index, splits: dict[int, Split]) -> Messages:
    """:class:`Messages` from NumPy columns of equal length (``cols``: field -> values)."""
    return Messages(
        {f: v.tolist() for f, v in cols.items()},
        np.asarray(arrival).tolist(),
        np.asarray(split).tolist(),
        np.asarray(row).tolist(),
        np.asarray(position).tolist(),
        np.asarray(index).tolist(),
        splits,
    )


@dataclass
class TaskError:
    """A task's first error: where (``split``, ``row``) and what (``message``; a conflict keeps
    its ``pair`` and ``atoms`` to be raised again as :class:`~subc.ir.decisions.ConflictingActions`)."""

    split: int
    row: int
    message: str
    pair: tuple | None = None
    atoms: list | None = None

    def exception(self) -> SubcError:
        """The error to raise."""
        if self.pair is not None:
            return ConflictingActions(self.pair, self.atoms or [])
        return SubcError(self.message)


@dataclass
class TaskResult:
    """Per message of the task (in its order) the index of its decision in ``decisions``; the
    state rules' ``hits`` (by rule index); ``no_match`` (messages no rule matched); ``error``."""

    decisions: list[Decision]
    chosen: np.ndarray
    hits: Counter = field(default_factory=Counter)
    no_match: int = 0
    error: TaskError | None = None


@dataclass
class ReferenceTask:
    """State rules on a group of messages: ``rules`` (the state rules its messages may match),
    ``spec``, ``longest_window`` (the longest window of all the job's state rules, ns: a message
    without a time fails when it is not 0, as in the sequential pass), ``msgs``, per message its
    ``candidates`` (indexes into ``rules``: the rules whose stateless part it matches, in rule
    order) and ``base`` (index into ``base_atoms``: the actions of the other rules, decided by value
    class) and ``others`` (whether any of those matched), and the ``default`` decision."""

    rules: list[Rule]
    spec: Spec
    longest_window: int
    msgs: Messages
    candidates: list[tuple[int, ...]]
    base: list[int]
    base_atoms: list[frozenset]
    others: list[bool]
    default: Decision


def run_reference(task: ReferenceTask) -> TaskResult:
    """The reference's decisions for the task's messages (see :class:`ReferenceTask`)."""
    ref = StatefulReference(task.rules, task.spec)
    ref.longest_window = task.longest_window
    msgs = task.msgs
    n = len(msgs.arrival)
    decisions: dict[Decision, int] = {}
    chosen = np.zeros(n, dtype=np.int64)
    out = TaskResult([], chosen)
    rules = task.rules
    for i in range(n):
        packet = msgs.packet(i)
        atoms = task.base_atoms[task.base[i]]
        try:
            t = ref.message_time(packet, msgs.arrival[i] if msgs.arrival[i] >= 0 else None, f"{msgs.where(i)}: ")
            matched = ref.matched(packet, t, [rules[j] for j in task.candidates[i]])
            for r in matched:
                out.hits[r.index] += 1
                atoms = atoms | r.atoms()
            if not matched and not task.others[i]:
                out.no_match += 1
            d = decide(atoms, task.default)
        except ConflictingActions as e:
            out.error = TaskError(msgs.split[i], msgs.row[i], str(e), e.pair, sorted(atoms, key=repr))
            break
        except SubcError as e:
            out.error = TaskError(msgs.split[i], msgs.row[i], e.message)
            break
        chosen[i] = decisions.setdefault(d, len(decisions))
    out.decisions = list(decisions)
    return out


@dataclass
class SimulatorTask:
    """The table simulator (``doc``: the compiled ``entries.json``) on a group of messages whose
    footprints share registers with no other group's (``msgs``)."""

    doc: EntriesDoc
    msgs: Messages


def run_simulator(task: SimulatorTask) -> TaskResult:
    """The tables' decisions for the task's messages, message by message through the table
    simulator, registers starting empty."""
    sim = TableSimulator(task.doc)
    msgs = task.msgs
    n = len(msgs.arrival)
    decisions: dict[Decision, int] = {}
    chosen = np.zeros(n, dtype=np.int64)
    out = TaskResult([], chosen)
    for i in range(n):
        try:
            d = sim.process(msgs.packet(i), arrival_ns=msgs.arrival[i] if msgs.arrival[i] >= 0 else None)
        except ValueError as e:
            out.error = TaskError(msgs.split[i], msgs.row[i], f"{msgs.where(i)}: {e}")
            break
        chosen[i] = decisions.setdefault(d, len(decisions))
    out.decisions = list(decisions)
    return out


def run_task(task: ReferenceTask | SimulatorTask) -> TaskResult:
    """:func:`run_reference` or :func:`run_simulator`, by the task's kind."""
    return run_reference(task) if isinstance(task, ReferenceTask) else run_simulator(task)
