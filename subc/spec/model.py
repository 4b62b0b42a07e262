"""The model of a message-format spec: header types, query fields, counters, actions, the parser.

What :mod:`.spec` (P4_16 and pragmas) and :mod:`.p4_14` (P4_14 declarations) parse a spec into;
every stage after the front end reads a spec through these classes.  The spec language is
described in :mod:`.spec`'s docstring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import Location, SubcError
from .const_expr import evaluate_text
from .source_map import SpecSource

MAX_FIELD_WIDTH = 128
#: Largest width of a ``bit<W>`` type (a C int, as p4c keeps widths; p4c itself stops at 2048):
#: anything wider is an error, never a number too big to print.
MAX_TYPE_WIDTH = (1 << 31) - 1
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Names a counter may not take: the aggregate functions, the update action, rule keywords.
COUNTER_RESERVED = frozenset(("count", "sum", "avg", "min", "max", "inc", "fwd", "drop", "and", "or", "not", "in"))


@dataclass
class HeaderType:
    """A ``header`` type: fields in order as (name, width in bits; None for varbit)."""

    name: str
    fields: list[tuple[str, int | None]]
    text: str

    def width_of(self, fname: str) -> int | None:
        for n, w in self.fields:
            if n == fname:
                return w
        raise KeyError(fname)

    def has(self, fname: str) -> bool:
        return any(n == fname for n, _ in self.fields)


@dataclass
class QueryField:
    """A field that rules may test.

    ``name`` is ``instance.field``; ``width`` in bits; ``match_kind`` one of 'range', 'exact',
    'lpm'; ``scale`` the number of implied decimal digits (None when the field is an integer);
    ``alpha`` True for ASCII text fields (strings only).
    """

    name: str
    width: int
    match_kind: str
    location: Location
    scale: int | None = None
    alpha: bool = False

    @property
    def header(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def member(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def max_value(self) -> int:
        return (1 << self.width) - 1


@dataclass
class NamedCounter:
    """A named counter of the spec (``@pragma query_counter(name[, window_us])``, or Camus's
    ``query_field_counter(name[, window_us])`` with a bare name): ``window_ns``, its tumbling
    window in ns (0: never ends; the spec's ``query_window`` when the pragma gives none), and the
    ``location`` of its name."""

    name: str
    window_ns: int
    location: Location


@dataclass
class SpecAction:
    """A top-level P4 ``action`` of the spec: parameters as (name, width in bits)."""

    name: str
    params: list[tuple[str, int]]
    text: str
    location: Location


@dataclass
class Transition:
    """A parser transition: direct (``select_text`` None) or select with (keyset text, target) cases.

    ``select_text`` and the keysets are P4_16 text (a P4_14 spec's are translated).  ``fields``
    names the selected fields in order as ``instance.field`` (the key is their concatenation), or
    is None when the select expression is not a list of header fields (the decoder then reports it).
    ``location`` is where the transition is written, ``case_locations`` where each case's keyset
    is (when known).
    """

    select_text: str | None
    cases: list[tuple[str, str]]
    fields: list[str] | None = None
    location: Location | None = None
    case_locations: list[Location] = field(default_factory=list)


@dataclass
class ParserState:
    """A parser state: statements as raw P4_16 text, the header instances it extracts in order,
    its transition, and ``location`` (the state's name in the spec)."""

    name: str
    statements: list[str]
    extracts: list[str]
    transition: Transition
    location: Location | None = None


@dataclass
class ParserDecl:
    """The spec's parser: parameter names by role and states in source order."""

    name: str
    packet: str
    hdr: str
    headers_type: str
    meta: str | None
    meta_type: str | None
    std_meta: str | None
    states: list[ParserState]


@dataclass(frozen=True)
class TopicFields:
    """``@pragma query_topic``: ``levels`` (the field holding a topic's number of levels) and
    ``labels`` (one field per level, the numeric label of that level's name), query field names."""

    levels: str
    labels: tuple[str, ...]
    location: Location


@dataclass
class Spec:
    """A parsed message-format spec (see the module docstring): ``path`` and ``text`` are the
    main file's as given and as written; ``source`` is the spec as the C preprocessor produced it
    (what was parsed, with the map back to every file it read; None for a spec built by hand)."""

    path: str
    text: str
    decls: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, name, raw text)
    consts: dict[str, int] = field(default_factory=dict)
    #: the declared type of a ``const`` of type ``bit<W>``/``int<W>``: (W, signed)
    const_types: dict[str, tuple[int, bool]] = field(default_factory=dict)
    typedefs: dict[str, int] = field(default_factory=dict)
    headers: dict[str, HeaderType] = field(default_factory=dict)
    structs: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # name -> (type, member, raw)
    parser: ParserDecl | None = None
    query_fields: dict[str, QueryField] = field(default_factory=dict)
    actions: dict[str, SpecAction] = field(default_factory=dict)
    default_action: str = "drop"
    default_action_location: Location | None = None
    #: 'p4_16', 'p4_14' (translated to P4_16 for the P4 targets) or 'pragmas' (pragma lines only)
    form: str = "p4_16"
    #: header instances after which a message carries a payload (``@pragma query_payload``)
    payload_instances: set[str] = field(default_factory=set)
    #: ``@pragma query_topic``: the topic levels' fields, or None
    topic: TopicFields | None = None
    #: ``@pragma query_window``: the aggregates' default tumbling window in ns (0: never ends)
    window_ns: int = 0
    #: ``@pragma query_field_counter(h.f, window_us)``: a field's aggregates' window in ns
    field_windows: dict[str, int] = field(default_factory=dict)
    #: ``@pragma query_counter``: the named counters, by name
    counters: dict[str, NamedCounter] = field(default_factory=dict)
    #: ``@pragma query_time``: the query field that gives a message's time, or None (arrival time)
    time_field: str | None = None
    #: ns per unit of :attr:`time_field`
    time_unit_ns: int = 1
    source: SpecSource | None = field(default=None, repr=False, compare=False)

    @property
    def preprocessed(self) -> str:
        """The spec's text as the front end read it (after the C preprocessor)."""
        return self.source.text if self.source is not None else self.text

    def constant(self, text: str) -> int:
        """The value of the constant expression ``text`` with the spec's constants (a keyset, a
        mask; :mod:`.const_expr`).  Raises :class:`~.const_expr.ConstExprError`."""
        return evaluate_text(text, self.consts, self.const_types, self.typedefs)

    @property
    def infers_actions(self) -> bool:
        """True when the rules may call actions the spec does not declare (a pragma-only or P4_14
        spec, as Camus allows): :meth:`declare_action` then declares them."""
        return self.form != "p4_16" or not self.whole_program

    def declare_action(self, name: str, widths: list[int], location: Location) -> SpecAction:
        """Declare action ``name`` with parameters of ``widths`` bits (``arg0``, ``arg1``, ...) as a
        rule calls it (see :attr:`infers_actions`); returns the declaration, which has an empty
        body in the generated control block.  Raises SubcError for a reserved or invalid name."""
        if name in ("fwd", "drop") or name.startswith("subc_") or not IDENT_RE.match(name):
            raise SubcError(f"action name {name!r} is reserved", location)
        params = [(f"arg{i}", w) for i, w in enumerate(widths)]
        decl = ", ".join(f"bit<{w}> {p}" for p, w in params)
        text = f"action {name}({decl}) {{\n    /* declared by the rules; the spec gives no body */\n}}"
        act = SpecAction(name, params, text, location)
        self.actions[name] = act
        return act

    @property
    def whole_program(self) -> bool:
        """True when the spec has headers and a parser, so a whole P4 program can be generated."""
        return self.parser is not None and self.parser.headers_type in self.structs

    @property
    def instances(self) -> dict[str, str]:
        """Header instances of the headers struct: instance name -> header type name."""
        if self.parser is not None and self.parser.headers_type in self.structs:
            members = self.structs[self.parser.headers_type]
        else:
            members = next((m for m in self.structs.values() if any(t in self.headers for t, _, _ in m)), [])
        return {mem: t for t, mem, _ in members if t in self.headers}

    def resolve_field(self, name: str) -> QueryField | None:
        """The query field named ``h.f``, or a bare ``f`` that is unique among query fields."""
        if name in self.query_fields:
            return self.query_fields[name]
        if "." not in name:
            hits = [q for q in self.query_fields.values() if q.member == name]
            if len(hits) == 1:
                return hits[0]
        return None

    def bare_ambiguity(self, name: str) -> list[str]:
        return sorted(q.name for q in self.query_fields.values() if q.member == name)
