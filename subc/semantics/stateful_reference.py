"""Reference semantics of comparisons on state: the rules evaluated on a timed message sequence.

This is the definition the compiled targets are checked against (docs/state.md "Stateful
subscriptions"); it shares nothing with the compiler's encoding (no update rules, no state
values, no excess registers): it keeps every rule's aggregates as plain Python numbers and
evaluates the rules' own conditions.

For each message that carries every header the rules test (a *classified* message; the others
get the default action and touch no state), at time ``t`` ns:

1. an aggregate holds the window of its last update: a comparison reads it when that window is
   ``t // window_ns`` (a window of length 0 never ends), else it reads an empty window; an update
   in another window (later or earlier) empties it first.  While time never goes back this is
   the same as moving every aggregate to the message's window on every message; when it does,
   an aggregate the message does not update keeps its window;
2. a rule's aggregates are updated with the message when the message matches the rule's
   *stateless part*: its condition holds for some truth values of its comparisons on state
   (each distinct comparison one unknown);
3. the rules are evaluated with their comparisons on the aggregates' new values: ``count`` and
   ``sum`` (saturating at 2**64 - 1) of an empty window are 0; ``avg`` (exact, a fraction),
   ``min`` and ``max`` of an empty window make every comparison false;  a comparison on a named
   counter (``@pragma query_counter``, one per spec, shared by every rule) sees its value before
   this message's updates: what earlier messages of its window added (0 in another window);
4. the matched rules' actions combine as for stateless rules (:mod:`subc.ir.decisions`);
5. then each distinct counter update among the matched rules' actions applies once (emptying
   the counter first when its window is not the message's): ``inc(c)`` and ``c <- count()`` add
   1, ``c <- sum(h.f)`` adds the message's ``h.f`` (saturating at 2**64 - 1).
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product
from typing import Sequence

from ..lang.ast import COUNTER, Aggregate, Rule, StatePred, evaluate, state_predicates
from ..ir.decisions import COUNT_ATOM, Decision
from ..spec.model import Spec
from ..errors import SubcError
from .reference import combine

SUM_MAX = (1 << 64) - 1


class _Window:
    """One aggregate's current window: its id and the values seen in it."""

    __slots__ = ("wid", "count", "total", "lo", "hi")

    def __init__(self, wid: int):
        self.wid, self.count, self.total = wid, 0, 0
        self.lo: int | None = None
        self.hi: int | None = None

    def add(self, v: int) -> None:
        self.count += 1
        self.total += v
        self.lo = v if self.lo is None else min(self.lo, v)
        self.hi = v if self.hi is None else max(self.hi, v)

    def value(self, kind: str) -> int | Fraction | None:
        if kind == "count":
            return self.count
        if kind == "sum":
            return min(self.total, SUM_MAX)
        if self.count == 0:
            return None
        if kind == "avg":
            return Fraction(self.total, self.count)
        return self.lo if kind == "min" else self.hi


class StatefulReference:
    """The rules ``rules`` of ``spec`` evaluated message by message with their state (see the
    module docstring).  :meth:`decide` takes messages in arrival order."""

    def __init__(self, rules: Sequence[Rule], spec: Spec):
        self.spec = spec
        #: the longest window of the rules' aggregates, in ns (0: none ends)
        self.longest_window = 0
        self.rules = list(rules)
        self.preds = {r.index: state_predicates(r.condition) for r in self.rules}
        self.aggs = {i: list(dict.fromkeys(p.agg for p in ps)) for i, ps in self.preds.items()}
        self.windows: dict[tuple[int, Aggregate], _Window] = {}
        #: named counter -> [window id, value]
        self.counters: dict[str, list[int]] = {}
        self.counter_windows = {c.name: c.window_ns for c in spec.counters.values()}
        windows = [a.window_ns for aggs in self.aggs.values() for a in aggs]
        if any(a[0] == COUNT_ATOM for r in self.rules for a in r.atoms()):
            windows += list(self.counter_windows.values())
        self.longest_window = max(windows, default=0)

    def message_time(self, packet: dict[str, int], arrival_ns: int | None, where: str = "") -> int:
        """A message's time in ns: the spec's time field (``query_time``) times its unit, else
        ``arrival_ns``; 0 when neither is known and no window ends.  Raises SubcError when a
        window ends and the time is unknown (a BinaryFILE has no arrival times)."""
        spec = self.spec
        if spec.time_field is not None:
            return packet[spec.time_field] * spec.time_unit_ns
        if arrival_ns is not None:
            return arrival_ns
        if self.longest_window:
            raise SubcError(
                f"{where}the rules' aggregates have windows of arrival time, and this message has none "
                "(a BinaryFILE has no arrival times): declare the time field with @pragma query_time"
            )
        return 0

    def relevant(self, rule: Rule, packet: dict[str, int]) -> bool:
        """True when ``packet`` matches ``rule``'s stateless part: its condition holds for some
        truth values of its distinct comparisons on state."""
        preds = self.preds[rule.index]
        for bits in product((False, True), repeat=len(preds)):
            truth = {p.key: b for p, b in zip(preds, bits)}
            if evaluate(rule.condition, packet, lambda p: truth[p.key]):
                return True
        return False

    def decide(self, packet: dict[str, int], time_ns: int) -> Decision:
        """The decision for the next classified message, ``packet`` ({'header.field': value}) at
        ``time_ns``; updates the state.  Raises
        :class:`~subc.ir.decisions.ConflictingActions` as the stateless reference does."""
        return combine(self.matched(packet, time_ns), self.spec)

    def counter(self, name: str, time_ns: int) -> int:
        """Named counter ``name``'s value as a comparison sees it at ``time_ns``: what its window
        holds when that is ``time_ns``'s window, else 0 (the counter is not changed)."""
        w = self.counter_windows[name]
        wid = time_ns // w if w else 0
        cell = self.counters.get(name)
        return cell[1] if cell is not None and cell[0] == wid else 0

    def matched(self, packet: dict[str, int], time_ns: int, candidates: Sequence[Rule] | None = None) -> list[Rule]:
        """The rules the next classified message matches (see :meth:`decide`); updates the state.
        ``candidates``: when given, exactly the rules whose stateless part the message matches, as
        the caller decided with :meth:`relevant` once for many equal messages (no other rule can
        match it or update anything, and these need not be decided again)."""
        matched = []
        counts = {name: self.counter(name, time_ns) for name in self.counter_windows}
        for r in self.rules if candidates is None else candidates:
            aggs = self.aggs[r.index]
            if not aggs:
                if evaluate(r.condition, packet):
                    matched.append(r)
                continue
            wins = {}
            relevant = True if candidates is not None else self.relevant(r, packet)
            for a in aggs:
                if a.kind == COUNTER:
                    continue
                wid = time_ns // a.window_ns if a.window_ns else 0
                w = self.windows.get((r.index, a))
                if w is None or w.wid != wid:
                    w = _Window(wid)
                    if relevant:
                        self.windows[(r.index, a)] = w
                if relevant:
                    w.add(packet[a.field] if a.field is not None else 0)
                wins[a] = w

            def state(p: StatePred) -> bool:
                if p.agg.kind == COUNTER:
                    assert p.agg.name is not None  # a named counter has its name
                    return p.holds(counts[p.agg.name])
                return p.holds(wins[p.agg].value(p.agg.kind))

            if evaluate(r.condition, packet, state):
                matched.append(r)
        updates = {a for r in matched for a in r.atoms() if a[0] == COUNT_ATOM}
        for _, name, field in updates:
            window_ns = self.counter_windows[name]
            wid = time_ns // window_ns if window_ns else 0
            cell = self.counters.setdefault(name, [wid, 0])
            if cell[0] != wid:
                cell[:] = [wid, 0]
            cell[1] = min(cell[1] + (packet[field] if field is not None else 1), SUM_MAX)
        return matched

    def value(self, rule: Rule, agg: Aggregate) -> int | Fraction | None:
        """The current value of ``rule``'s aggregate ``agg`` in the window of its last update (a
        named counter's after the last message's updates)."""
        if agg.kind == COUNTER:
            assert agg.name is not None  # a named counter has its name
            return self.counters.get(agg.name, [0, 0])[1]
        w = self.windows.get((rule.index, agg))
        return _Window(0).value(agg.kind) if w is None else w.value(agg.kind)
