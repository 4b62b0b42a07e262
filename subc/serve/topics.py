"""Hierarchical topics for ``subc serve``: topic names, MQTT-style filters, numeric labels, and the
condition a filter becomes on the topic fields of the spec (``@pragma query_topic``).

A topic name is a ``/``-separated list of levels (``market/nasdaq/AAPL``).  The broker gives each
level name a numeric *label* (``REGISTER`` -> ``REGACK``), as Tatarski et al. label topic levels
before the kernel sees them, so that the data path matches only numbers.  A publisher writes the
number of levels and the label of each into the spec's topic fields.  A filter (``SUB``) uses the
wildcards of MQTT: ``+`` matches exactly one level, a final ``#`` matches its parent level and any
number of levels below it; so ``market/+/AAPL`` becomes ``levels == 3 and l0 == L(market) and l2 ==
L(AAPL)`` and ``market/#`` ``levels >= 1 and l0 == L(market)``.

Rules (MQTT Version 3.1.1, OASIS Standard 2014, section 4.7, "Topic Names and Topic Filters"):
names and filters are non-empty and case-sensitive, levels may be empty (``a//b``); ``#`` is valid
only alone as the last level of a filter and ``+`` only alone in a level; names hold no wildcard.
Names beginning with ``$`` are reserved for the broker (4.7.2) and refused, so a filter's leading
wildcard never meets one.  subc's requests are ASCII lines: a name or filter is printable ASCII
without spaces, at most :data:`MAX_TOPIC_BYTES` bytes, and at most as many levels as the spec has
label fields.

Labels are given from 1 upward and never reused while the store lives: a label is forgotten with
its name once no registration and no subscription uses the name, and a name registered again gets
a new label, so a publisher that kept an old label reaches no one.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..lang.limits import Limits
from ..lang.rules import parse_rules
from ..spec.model import Spec, TopicFields
from ..errors import SubcError
from .store import REMOVED, TopicChanges

MAX_TOPIC_BYTES = 1024


class TopicError(Exception):
    """A bad topic name or filter: ``column`` (1-based, in the name or filter) and ``message``."""

    def __init__(self, column: int, message: str):
        super().__init__(message)
        self.column, self.message = column, message


def _levels(text: str, what: str, depth: int) -> tuple[str, ...]:
    if not text:
        raise TopicError(1, f"empty {what}")
    if len(text) > MAX_TOPIC_BYTES:
        raise TopicError(MAX_TOPIC_BYTES + 1, f"{what} longer than {MAX_TOPIC_BYTES} bytes")
    for i, ch in enumerate(text):
        if not ("!" <= ch <= "~"):
            raise TopicError(i + 1, f"{what} holds {ch!r}: printable ASCII without spaces only")
    return tuple(text.split("/"))


def parse_topic(name: str, depth: int) -> tuple[str, ...]:
    """The levels of topic ``name`` (at most ``depth``).  Raises :class:`TopicError`."""
    levels = _levels(name, "topic name", depth)
    for i, ch in enumerate(name):
        if ch in "+#":
            raise TopicError(i + 1, f"a topic name holds no wildcard ('{ch}'); wildcards are for SUB filters")
    if name.startswith("$"):
        raise TopicError(1, "topic names beginning with '$' are reserved for the broker")
    if len(levels) > depth:
        raise TopicError(len("/".join(levels[:depth])) + 1, f"more than {depth} levels (the spec's label fields)")
    return levels


def parse_filter(text: str, depth: int) -> tuple[str, ...]:
    """The levels of topic filter ``text`` (``+`` and a final ``#`` as levels; at most ``depth``
    levels besides a final ``#``).  Raises :class:`TopicError`."""
    levels = _levels(text, "topic filter", depth)
    col = 1
    for i, lv in enumerate(levels):
        for j, ch in enumerate(lv):
            if ch in "+#" and len(lv) != 1:
                raise TopicError(col + j, f"'{ch}' must fill a whole level")
        if lv == "#" and i != len(levels) - 1:
            raise TopicError(col, "'#' must be the last level")
        col += len(lv) + 1
    fixed = levels[:-1] if levels[-1] == "#" else levels
    if len(fixed) > depth:
        raise TopicError(len("/".join(levels[:depth])) + 1, f"more than {depth} levels (the spec's label fields)")
    return levels


@dataclass
class _Label:
    label: int
    refs: int


class LabelTable:
    """Level name -> label, counted by the registrations and subscriptions that use the name.

    ``known``: the stored labels (name -> label); ``next_label``: the first label never given;
    ``limit``: one past the largest label the label fields hold.  :meth:`acquire` and
    :meth:`release` record what changed in ``added`` and ``forgotten`` until :meth:`changes`
    takes them (for the store)."""

    def __init__(self, known: dict[str, int], next_label: int, limit: int):
        self.names: dict[str, _Label] = {n: _Label(lab, 0) for n, lab in known.items()}
        self.next_label = max([next_label, 1] + [lab + 1 for lab in known.values()])
        self.limit = limit
        self.added: dict[str, int] = {}
        self.forgotten: set[str] = set()

    def acquire(self, names) -> list[int]:
        """The labels of ``names`` (each referenced once more; new names get new labels).
        Raises SubcError when the labels are exhausted (nothing is then acquired)."""
        new = {n for n in names if n not in self.names}
        if self.next_label + len(new) > self.limit:
            raise SubcError(f"no labels left (labels are {self.limit - 1} at most and never reused)")
        out = []
        for n in names:
            e = self.names.get(n)
            if e is None:
                e = self.names[n] = _Label(self.next_label, 0)
                self.next_label += 1
                self.added[n] = e.label
                self.forgotten.discard(n)
            e.refs += 1
            out.append(e.label)
        return out

    def release(self, names) -> None:
        """Drop one reference to each of ``names``; a name no one uses is forgotten."""
        for n in names:
            e = self.names.get(n)
            if e is None:
                continue
            e.refs -= 1
            if e.refs <= 0:
                del self.names[n]
                if self.added.pop(n, None) is None:
                    self.forgotten.add(n)

    def forget_unused(self) -> list[str]:
        """Forget the names nobody references (after a restore); returns them."""
        gone = [n for n, e in self.names.items() if e.refs <= 0]
        for n in gone:
            del self.names[n]
            self.forgotten.add(n)
        return gone

    def label(self, name: str) -> int | None:
        e = self.names.get(name)
        return None if e is None else e.label

    def changes(self) -> tuple[dict[str, int], set[str]]:
        """(names given a label, names forgotten) since the last call."""
        out = (self.added, self.forgotten)
        self.added, self.forgotten = {}, set()
        return out

    def __len__(self) -> int:
        return len(self.names)


class TopicSchema:
    """The topic fields of ``spec`` (``@pragma query_topic``): ``depth`` (levels at most) and the
    largest label (:attr:`label_limit` is one past it).  Raises SubcError when the spec has none."""

    def __init__(self, spec: Spec):
        if spec.topic is None:
            raise SubcError("the spec has no topic fields (@pragma query_topic): REGISTER and SUB are not served")
        self.fields: TopicFields = spec.topic
        self.levels = spec.query_fields[self.fields.levels]
        self.labels = [spec.query_fields[f] for f in self.fields.labels]
        self.depth = len(self.labels)
        self.label_limit = min(1 << q.width for q in self.labels)

    def condition(self, levels: tuple[str, ...], labels: dict[str, int], where: str = "") -> str:
        """The condition (rule-language text) that filter ``levels`` becomes, with ``labels``
        (name -> label) for each of its literal levels, ``and`` the ``where`` condition (if any)."""
        hash_ = bool(levels) and levels[-1] == "#"
        fixed = levels[:-1] if hash_ else levels
        lv = self.levels.name
        if not hash_:
            parts = [f"{lv} == {len(fixed)}"]
        elif self.levels.match_kind == "range":
            parts = [f"{lv} >= {max(len(fixed), 1)}"]
        else:
            parts = [f"{lv} in {{{', '.join(str(n) for n in range(max(len(fixed), 1), self.depth + 1))}}}"]
        for q, name in zip(self.labels, fixed):
            if name != "+":
                parts.append(f"{q.name} == {labels[name]}")
        text = " and ".join(parts)
        return f"{text} and ({where})" if where else text


def literal_levels(levels: tuple[str, ...]) -> list[str]:
    """The names a filter's (or topic's) levels reference: every level but ``+`` and ``#``."""
    return [lv for lv in levels if lv not in ("+", "#")]


@dataclass
class Registration:
    """A publisher's registration of a topic: its ``levels``, their ``labels``, lease ``expires``
    (Unix s, or None)."""

    levels: tuple[str, ...]
    labels: list[int]
    expires: float | None


class TopicBook:
    """The topic state of a daemon (owned by its updater thread): the :class:`LabelTable`, the
    registrations by (topic, source address) and their leases, and the changes not yet committed
    (:meth:`changes`, for :meth:`~.store.Store.commit`)."""

    def __init__(self, spec: Spec, known: dict[str, int], next_label: int, limits: Limits):
        self.spec, self.limits = spec, limits
        self.schema = TopicSchema(spec)
        self.labels = LabelTable(known, next_label, self.schema.label_limit)
        self.regs: dict[tuple[str, str], Registration] = {}
        self.per_source: dict[str, int] = {}
        self.leases: list[tuple[float, tuple[str, str]]] = []
        self.pending: dict[tuple[str, str], float | None | str] = {}

    # -- subscriptions ------------------------------------------------------------------------
    def condition(self, levels: tuple[str, ...], where: str):
        """(condition AST, names referenced) of filter ``levels`` and its ``where`` text (or ''):
        the filter's condition (:meth:`TopicSchema.condition`) ``and`` the ``where`` condition.
        The names are referenced once more (:meth:`release` them with the subscription).  Raises
        SubcError (labels exhausted, or the rule over the limits)."""
        names = literal_levels(levels)
        labels = self.labels.acquire(names)
        try:
            text = self.schema.condition(levels, dict(zip(names, labels)), where)
            cond = parse_rules(text + " : fwd(0);", self.spec, "<topic>", limits=self.limits)[0].condition
        except SubcError:
            self.labels.release(names)
            raise
        return cond, names

    def release(self, names) -> None:
        self.labels.release(names)

    # -- registrations ------------------------------------------------------------------------
    def register(
        self, topic: str, levels: tuple[str, ...], source: str, expires: float | None, per_source: int
    ) -> list[int]:
        """Register (or renew) ``topic`` for ``source``; returns its labels.  Raises SubcError
        when ``source`` has ``per_source`` registrations already or the labels are exhausted."""
        key = (topic, source)
        reg = self.regs.get(key)
        if reg is None:
            if self.per_source.get(source, 0) >= per_source:
                raise SubcError(f"{source} has {per_source} registrations, the most one source may have")
            reg = self.regs[key] = Registration(levels, self.labels.acquire(levels), expires)
            self.per_source[source] = self.per_source.get(source, 0) + 1
        reg.expires = expires
        if expires is not None:
            heapq.heappush(self.leases, (expires, key))
        self.pending[key] = expires
        return reg.labels

    def unregister(self, topic: str, source: str) -> bool:
        """Forget ``source``'s registration of ``topic``; False when it has none."""
        reg = self.regs.pop((topic, source), None)
        if reg is None:
            return False
        self.labels.release(reg.levels)
        self.per_source[source] -= 1
        if not self.per_source[source]:
            del self.per_source[source]
        self.pending[(topic, source)] = REMOVED
        return True

    def renew(self, source: str, expires: float | None) -> int:
        """Renew every registration of ``source``; returns how many."""
        n = 0
        for (topic, src), reg in self.regs.items():
            if src == source:
                reg.expires = expires
                if expires is not None:
                    heapq.heappush(self.leases, (expires, (topic, src)))
                self.pending[(topic, src)] = expires
                n += 1
        return n

    def expire(self, now: float) -> int:
        """Forget the registrations whose lease ended by ``now``; returns how many."""
        n = 0
        while self.leases and self.leases[0][0] <= now:
            _, key = heapq.heappop(self.leases)
            reg = self.regs.get(key)
            if reg is not None and reg.expires is not None and reg.expires <= now:
                n += self.unregister(*key)
        return n

    def listing(self, source: str) -> list[str]:
        """``REG <topic> <labels>`` lines of ``source``'s registrations."""
        return [f"REG {t} {' '.join(map(str, r.labels))}" for (t, s), r in sorted(self.regs.items()) if s == source]

    # -- the store ----------------------------------------------------------------------------
    def dirty(self) -> bool:
        return bool(self.pending or self.labels.added or self.labels.forgotten)

    def changes(self) -> TopicChanges:
        """What changed since the last call, for the store."""
        added, forgotten = self.labels.changes()
        regs, self.pending = self.pending, {}
        return TopicChanges(added, forgotten, self.labels.next_label, regs)
