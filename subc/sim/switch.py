"""Table simulator: run a packet through the emitted entries (``entries.json``) as a switch would.

It reads nothing but the ``entries.json`` document, and follows P4 table semantics: exact keys
must be equal, range keys contain the value, lpm keys pick the longest prefix, ternary keys
match under the mask; among several hits of a table with range or ternary keys the largest
priority wins (P4Runtime convention); a miss runs the default action, and a step's ``on_miss``
table is applied when its table missed.  The actions of the last stage (and the document's
``default_action``) map to a :class:`Decision` (multicast groups resolved through
``multicast_groups``).

A document of the multi-message P4 program (``messages`` present, see
:mod:`subc.backends.p4.slots`) has per-message leaf actions (``subc_msg_fwd(ports)``: a
bitmap over ``messages.ports``; ``subc_msg_hold(code)``: the non-forwarding decision of
``messages.held``) and one copy of every table per message slot; :class:`TableSimulator` runs a
message through slot 0's (after checking that every slot carries the same entries), and
:class:`SwitchSimulator` runs whole datagrams as the switch does: every message through the
tables, then one copy per port with exactly its messages (:class:`~.delivery.Delivery`), the
datagrams the switch cannot split to the overflow port.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import AbstractSet, Callable

from ..semantics.delivery import Delivery, recipients_of, split_payload
from ..wire.moldudp64 import END_OF_SESSION, HEARTBEAT
from ..semantics.reference import Decision
from ..semantics.state_model import StateModel
from ..backends.p4.entries_doc import EntriesDoc, Entry, Key, TableDoc

_BUILTIN = {"subc_drop": ("drop",), "subc_nop": ("nop",)}


def leaf_decision(action: str, params: dict, groups: dict[int, tuple[int, ...]]) -> Decision:
    """The :class:`Decision` of a leaf action of ``entries.json`` (``groups``: multicast group ->
    sorted ports).  Raises KeyError for an unknown multicast group."""
    if action == "subc_fwd":
        return Decision((params["port"],), None)
    if action == "subc_mcast":
        return Decision(groups[params["group"]], None)
    if action in _BUILTIN:
        return Decision((), _BUILTIN[action])
    return Decision((), (action, *params.values()))


class _Table:
    """One table with an index for the common shapes: (state exact, X) keys are grouped by state."""

    def __init__(self, t: TableDoc):
        self.name = t.name
        self.keys = t.keys
        self.default = (t.default_action.action, t.default_action.params)
        self.entries = t.entries
        self.kinds = [k.match_kind for k in self.keys]
        self.bits = t.bits
        self.by_state: dict[int | None, list[Entry]] = defaultdict(list)
        self.exact: dict[tuple, tuple[str, dict[str, int]]] = {}
        self.all_exact = all(k == "exact" for k in self.kinds)
        if self.all_exact:
            for e in self.entries:
                self.exact[tuple(m.a for m in e.match)] = (e.action, e.params)
        else:
            for e in self.entries:
                first = e.match[0]
                self.by_state[first.a if first.kind == "exact" else None].append(e)

    def lookup(self, values: list[int]) -> tuple[bool, tuple[str, dict[str, int]]]:
        """(hit, (action, params)) for key ``values`` in key order."""
        if self.all_exact:
            hit = self.exact.get(tuple(values))
            return (True, hit) if hit is not None else (False, self.default)
        candidates = self.by_state.get(values[0] if self.kinds[0] == "exact" else None, [])
        best: Entry | None = None
        best_rank = 0
        for e in candidates:
            rank = 0
            ok = True
            for m, v, bits in zip(e.match, values, self.bits):
                ok = m.matches(v, bits)
                if not ok:
                    break
                if m.kind == "lpm":
                    rank = m.b
            if not ok:
                continue
            if e.priority is not None:
                rank = e.priority
            if best is None or rank > best_rank:
                best, best_rank = e, rank
        if best is None:
            return False, self.default
        return True, (best.action, best.params)


class TableSimulator:
    """Run packets through the tables of an ``entries.json`` document (:class:`EntriesDoc`).

    ``process(packet)`` takes ``{'header.field': value}`` and the set of valid header instances
    (all headers the fields belong to, when omitted) and returns a :class:`Decision`.
    Raises ValueError when the message slots' copies of a table differ.
    """

    def __init__(self, doc: EntriesDoc):
        self.doc = doc
        self.tables = {t.name: _Table(t) for t in doc.tables}
        self.steps = [(s.table, s.on_miss) for s in doc.pipeline]
        self.groups = doc.groups
        self.headers = doc.headers
        self.default_action = (doc.default_action.action, doc.default_action.params)
        self.state_key = doc.state_key
        self.code_key = doc.code_key or self.state_key.rsplit(".", 1)[0] + ".subc_code"
        self.trace: list[tuple[str, bool, str]] = []
        self.state = StateModel(doc.state) if doc.state is not None else None
        self.messages = doc.messages
        if self.messages is not None:
            self.ports = list(self.messages.ports)
            self.held = {h.code: (h.action, h.params) for h in self.messages.held}
            self._check_slots(doc)

    @staticmethod
    def _check_slots(doc: EntriesDoc) -> None:
        """Raise ValueError unless every slot's copy of a table has slot 0's entries and default."""
        by_slot: dict[int, list[TableDoc]] = defaultdict(list)
        for t in doc.tables:
            if t.slot is not None:
                by_slot[t.slot].append(t)
        first = [(t.entries, t.default_action) for t in by_slot.get(0, [])]
        for i, ts in by_slot.items():
            if [(t.entries, t.default_action) for t in ts] != first:
                raise ValueError(f"slot {i}'s tables differ from slot 0's")

    def _key_value(self, key: Key, packet: dict[str, int], meta: dict[str, int]) -> int:
        name = key.name
        if name in meta:
            return meta[name]
        if key.field is not None:
            return packet[key.field]
        field = name.split(".", 1)[1]
        return packet[field]

    def _decision(self, action: str, params: dict) -> Decision:
        if self.messages is not None:
            if action == "subc_msg_fwd":
                bits = params["ports"]
                return Decision(tuple(p for j, p in enumerate(self.ports) if bits >> j & 1), None)
            if action == "subc_msg_hold":
                name, args = self.held[params["code"]]
                return leaf_decision(name, args, self.groups)
        return leaf_decision(action, params, self.groups)

    def process(
        self,
        packet: dict[str, int],
        valid: AbstractSet[str] | None = None,
        trace: bool = False,
        arrival_ns: int | None = None,
    ) -> Decision:
        """The decision for ``packet`` (see the class docstring).  With comparisons on state (the
        document's ``state`` section), the registers (:class:`~.state_model.StateModel`) are
        updated between the update table and the state-value stages, at the message's time: its
        time field's, else ``arrival_ns`` (ValueError when neither is known)."""
        if valid is not None and not all(h in valid for h in self.headers):
            return self._decision(*self.default_action)
        state_key = self.state_key
        meta = {state_key: self.doc.initial_state, self.code_key: 0}
        model = self.state
        time_ns = model.message_time(packet, arrival_ns) if model is not None else 0
        if trace:
            self.trace = []
        result = None
        for table_name, on_miss in self.steps:
            for name in (table_name, on_miss):
                if name is None:
                    continue
                t = self.tables[name]
                hit, (action, params) = t.lookup([self._key_value(k, packet, meta) for k in t.keys])
                if trace:
                    self.trace.append((name, hit, action))
                if action == "subc_set_state":
                    meta[state_key] = params["next_state"]
                elif action == "subc_set_code":
                    meta[self.code_key] = params["code"]
                elif model is not None and name == model.update_table:
                    model.step(params["mask"], packet, time_ns, meta)
                elif model is not None and name == model.count_table:
                    model.count(params["mask"], packet, time_ns)
                elif action != "NoAction":
                    result = self._decision(action, params)
                if hit or name == on_miss:
                    break
        return result if result is not None else self._decision(*self.default_action)


class SwitchSimulator:
    """Datagrams through the multi-message P4 program as the switch runs it (docs/p4-messages.md "P4: every
    message of a datagram"), from its ``entries.json`` document ``doc`` alone.

    ``decode(message bytes, network)`` gives a message's ``(field values, valid instances)``, or
    None when the switch cannot frame it (a type the spec does not parse, a parser reject, a block
    length that differs from its type's length); ``network`` is passed through from
    :meth:`datagram`.  :meth:`datagram` returns ``{port: UDP payload}`` of one datagram:

    * a heartbeat (count 0) or end of session (0xFFFF): every subscriber port (``messages.ports``),
      with its next sequence number, which does not advance;
    * more than ``messages.max_messages`` messages, a message the switch cannot frame, or a
      payload whose MoldUDP64 framing disagrees with its bytes: the datagram unchanged to
      ``messages.overflow_port`` (nowhere when it is null), counted in :attr:`counters`
      (``too_many``, ``unframed``, ``malformed``);
    * otherwise each message is classified by the tables; a port receives one copy with exactly
      the messages whose decision forwards to it (:func:`~.delivery.recipients_of` with
      ``broker=False``: ``drop``, ``nop`` and spec actions deliver to nobody and are counted in
      :attr:`held` by their code), and its own sequence number, which advances by the copy's count
      (:class:`~.delivery.Delivery`).

    Raises ValueError for a document without ``messages`` (not the multi-message program).
    """

    def __init__(self, doc: EntriesDoc, decode: Callable[[bytes, object], tuple[dict, set] | None]):
        m = doc.messages
        if m is None:
            raise ValueError("not the entries.json of a multi-message P4 program (no 'messages')")
        self.tables = TableSimulator(doc)
        self.decode = decode
        self.max_messages = m.max_messages
        self.overflow_port = m.overflow_port
        self.codes = {(h.action, tuple(h.params.values())): h.code for h in m.held}
        self.delivery = Delivery(decide=lambda _msg: set(), everyone=list(m.ports))
        self.counters: Counter = Counter()
        self.held: Counter = Counter()

    def _whole(self, payload: bytes, reason: str) -> dict:
        self.counters[reason] += 1
        return {} if self.overflow_port is None else {self.overflow_port: payload}

    def datagram(self, payload: bytes, network=None) -> dict[int, bytes]:
        """``{port: UDP payload}`` of the datagram with UDP payload ``payload`` (see the class
        docstring); ``network`` goes to ``decode``."""
        parts = split_payload(payload)
        if parts is None:
            return self._whole(payload, "malformed")
        _, _, count, msgs = parts
        if count in (HEARTBEAT, END_OF_SESSION):
            self.counters["heartbeat"] += 1
            return self._copies(payload)
        if count > self.max_messages:
            return self._whole(payload, "too_many")
        decoded = []
        for msg in msgs:  # the switch frames the whole datagram before it classifies a message
            got = self.decode(msg, network)
            if got is None:
                return self._whole(payload, "unframed")
            decoded.append(got)
        recipients = []  # in message order: equal messages may be decided differently (state)
        for values, valid in decoded:
            d = self.tables.process(values, valid)
            if not d.ports:
                self.held[self.codes.get(self._atom(d), 0)] += 1
            recipients.append(recipients_of(d, broker=False))
        self.counters["classified"] += 1
        nxt = iter(recipients)
        self.delivery.decide = lambda _msg: next(nxt)
        return self._copies(payload)

    def _copies(self, payload: bytes) -> dict[int, bytes]:
        """``{port: UDP payload}`` of the copies :attr:`delivery` makes of a well-framed datagram."""
        copies = self.delivery.datagram(payload)
        assert copies is not None  # split_payload accepted the payload: it is not malformed
        return {p: c.payload() for p, c in copies.items()}

    @staticmethod
    def _atom(d: Decision) -> tuple:
        assert d.action is not None  # a decision that forwards nowhere has its action
        name = d.action[0]
        return ({"drop": "subc_drop", "nop": "subc_nop"}.get(name, name), tuple(d.action[1:]))
