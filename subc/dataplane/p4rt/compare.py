"""Whether a switch holds a rule set: its entries compared with the compiled ones up to the
numbering of states and multicast groups (``subc verify``), and the entries of a document in a
canonical form (:class:`Row`) in which equal matches are equal, as P4Runtime reads them back
(section 9.1.1).

The tables of ``entries.json`` are keyed by a *state* and every stage's actions set the next
state, so the entries form a diagram from the root state;
:class:`~subc.backends.p4.state_index.StateIndex` gives each node a signature (its entries with
the next states replaced by their signatures and groups by their port sets, bottom-up), the same
signature an update (:mod:`.plan`) keeps states by.  :func:`compare` compares, table by table, the
entries of the nodes each root reaches in that form.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...backends.p4.entries_doc import EntriesDoc
from ...backends.p4.state_index import StateIndex, canonical_match


@dataclass
class Row:
    """One entry in canonical form: ``key`` (match elements, priority) and ``value`` (action and
    sorted parameters)."""

    table: str
    key: tuple
    action: str
    params: tuple


def rows(doc: EntriesDoc) -> list[Row]:
    """Every entry of ``doc`` as a :class:`Row`."""
    out = []
    for t in doc.tables:
        bits = t.bits
        for e in t.entries:
            match = tuple(canonical_match(m, b) for m, b in zip(e.match, bits))
            out.append(Row(t.name, (match, e.priority), e.action, tuple(sorted(e.params.items()))))
    return out


def abstract_tables(index: StateIndex) -> dict[str, list[str]]:
    """Table name -> sorted entries (:meth:`StateIndex.abstract_rows`: states as signatures, groups
    as port sets) of the nodes the root reaches, and the entries of the tables keyed by no state
    (canonical, :class:`Row`)."""
    out: dict[str, list[str]] = {t.name: [] for t in index.skeleton.tables}
    for node in index.reachable():
        for table, text in index.abstract_rows(node):
            out[table].append(text)
    for table, es in index.shared.items():
        bits = index.tables[table].bits
        for e in es:
            match = tuple(canonical_match(m, b) for m, b in zip(e.match, bits))
            out[table].append(repr(((match, e.priority), e.action, tuple(sorted(e.params.items())))))
    return {t: sorted(v) for t, v in out.items()}


def compare(switch: EntriesDoc, compiled: EntriesDoc) -> list[str]:
    """Differences between the entries a switch holds (``switch``, read back) and a compiled
    rule set, up to the numbering of states and multicast groups: one line per table (or the
    groups) that differs, states the switch's root does not reach, earlier roots beyond the one
    an update keeps; empty when the switch classifies every packet as ``compiled`` says."""
    a, b = StateIndex.from_doc(switch), StateIndex.from_doc(compiled)
    ta, tb = abstract_tables(a), abstract_tables(b)
    out = []
    for name in sorted(set(ta) | set(tb)):
        x, y = ta.get(name, []), tb.get(name, [])
        if x != y:
            sx, sy = set(x), set(y)
            missing = sum(1 for r in y if r not in sx)
            extra = sum(1 for r in x if r not in sy)
            out.append(
                f"{name}: {missing} entries of the rule set are missing on the switch and {extra} entries "
                f"on the switch are not in the rule set ({len(x)} on the switch, {len(y)} compiled)"
            )
    ga, gb = sorted(a.groups.values()), sorted(b.groups.values())
    if ga != gb:
        out.append(f"multicast groups: the switch has port sets {ga}, the rule set {gb}")
    spares = a.spare_roots()
    leftover = len(set(a.nodes) - a.reachable() - {(0, a.root)} - set(spares))
    if leftover:
        out.append(f"{leftover} states on the switch are not reachable from its root (left over)")
    if len(spares) > 1:
        out.append(f"{len(spares)} earlier roots are on the switch where one (the next update's spare) is kept")
    return out
