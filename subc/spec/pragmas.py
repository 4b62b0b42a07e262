"""The ``@pragma query_*`` annotations of a spec (the table in :mod:`.front_end`'s docstring), applied
to the :class:`~.model.Spec` the front end has parsed: query fields and their match kinds, widths,
scales and alphabets, the default action, payload headers, topic fields, counters, windows and the
time field.  A mixin of the front end's parser (:class:`PragmaRules`), which gives it ``spec``,
``pragmas`` and the error helpers.  Numeric arguments are constant expressions
(:mod:`.const_expr`).  Every misuse raises SubcError at the pragma."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import Location, SubcError
from .const_expr import ConstExprError
from .p4lexer import Pragma
from .model import (
    COUNTER_RESERVED,
    IDENT_RE,
    MAX_FIELD_WIDTH,
    MAX_TYPE_WIDTH,
    NamedCounter,
    QueryField,
    Spec,
    TopicFields,
)


class PragmaRules:
    """What the spec's pragmas declare (:meth:`apply_pragmas`), for the front end's parser."""

    # -- what the host parser provides (declared for the type checker) -----------------------
    #: the spec parsed so far, which the pragmas complete
    spec: Spec
    #: the spec's ``@pragma`` lines, in source order
    pragmas: list[Pragma]

    if TYPE_CHECKING:

        def loc(self, offset: int) -> Location: ...

    def apply_pragmas(self) -> None:
        spec = self.spec
        instances = spec.instances
        extra: list[Pragma] = []
        # counters declared without a window, which take the spec's query_window (it may come later)
        unwindowed: list[NamedCounter] = []
        kinds = {
            "query_field": "range",
            "query_field_range": "range",
            "query_field_exact": "exact",
            "query_field_lpm": "lpm",
        }
        for p in self.pragmas:
            if p.name in kinds:
                self.query_field_pragma(p, kinds[p.name], instances)
            elif p.name == "query_field_counter" and p.args and "." not in p.args[0]:
                self.counter_pragma(p, unwindowed)  # Camus: query_field_counter(name, tumble time)
            elif p.name == "query_field_counter":
                self.field_counter_pragma(p, instances)
            elif p.name == "query_counter":
                self.counter_pragma(p, unwindowed)
            elif p.name in (
                "query_field_scale",
                "query_field_alpha",
                "query_default_action",
                "query_payload",
                "query_topic",
                "query_window",
                "query_time",
            ):
                extra.append(p)
            elif p.name == "query_control":
                continue  # Camus: where its generated control goes; subc generates the whole pipeline
            elif p.name.startswith("query_"):
                raise SubcError(f"unknown pragma '{p.name}'", self.loc(p.offset))
        for p in extra:
            if p.name == "query_default_action":
                if len(p.args) != 1 or not IDENT_RE.match(p.args[0]):
                    raise SubcError("query_default_action takes one action name", self.loc(p.offset))
                spec.default_action = p.args[0]
                spec.default_action_location = self.loc(p.arg_offsets[0])
                continue
            if p.name == "query_payload":
                self.payload_pragma(p, instances)
                continue
            if p.name == "query_topic":
                self.topic_pragma(p)
                continue
            if p.name == "query_window":
                if len(p.args) != 1:
                    raise SubcError("query_window takes one window length in us", self.loc(p.offset))
                spec.window_ns = self.window_arg(p, 0)
                continue
            if p.name == "query_time":
                self.time_pragma(p)
                continue
            want = 2 if p.name == "query_field_scale" else 1
            if len(p.args) != want:
                raise SubcError(f"{p.name} takes {want} argument(s)", self.loc(p.offset))
            q = spec.query_fields.get(p.args[0])
            if q is None:
                raise SubcError(
                    f"'{p.args[0]}' is not a query field (declare it with @pragma query_field first)",
                    self.loc(p.arg_offsets[0]),
                )
            if p.name == "query_field_alpha":
                if q.width % 8:
                    raise SubcError(f"alpha field {q.name} must be a whole number of bytes wide", self.loc(p.offset))
                q.alpha = True
            else:
                digits = self.pragma_int(p.args[1])
                if digits is None or not 0 <= digits <= 18:
                    raise SubcError("scale must be a number of decimal digits from 0 to 18", self.loc(p.arg_offsets[1]))
                q.scale = digits
        for c in unwindowed:  # query_window may come after query_counter
            c.window_ns = spec.window_ns
        for c in spec.counters.values():
            if spec.resolve_field(c.name) is not None or spec.bare_ambiguity(c.name):
                raise SubcError(f"counter '{c.name}' has the name of a query field; give it another name", c.location)
        da = spec.default_action
        if da not in ("drop", "nop") and da not in spec.actions and spec.infers_actions and IDENT_RE.match(da):
            # a default action other than drop is the pragma's, which gives its location too
            assert spec.default_action_location is not None
            spec.declare_action(da, [], spec.default_action_location)
        if da not in ("drop", "nop") and (da not in spec.actions or spec.actions[da].params):
            raise SubcError(
                f"default action '{da}' must be drop, nop, or a spec action without parameters",
                spec.default_action_location or self.loc(0),
            )

    def pragma_int(self, text: str) -> int | None:
        """The value of a pragma's numeric argument ``text`` (a constant expression: a literal,
        a constant, arithmetic a macro produced), or None when it is not one."""
        try:
            return self.spec.constant(text)
        except ConstExprError:
            return None

    def window_arg(self, p: Pragma, i: int) -> int:
        """Argument ``i`` of ``p`` as a window length in us, returned in ns (0: never ends)."""
        us = self.pragma_int(p.args[i])
        if us is None or not 0 <= us < 1 << 40:
            raise SubcError(
                f"bad window '{p.args[i]}' (a whole number of us, 0 for a window that never ends)",
                self.loc(p.arg_offsets[i]),
            )
        return us * 1000

    def counter_pragma(self, p: Pragma, unwindowed: list[NamedCounter]) -> None:
        """``query_counter(name[, window_us])``: a named counter (:class:`NamedCounter`) that the
        rules compare by name and update with ``inc(name)`` or ``name <- count()`` /
        ``name <- sum(h.f)``.  A counter without a window is added to ``unwindowed`` (its window is
        the spec's ``query_window``, set when every pragma has been read)."""
        if not 1 <= len(p.args) <= 2:
            raise SubcError(f"{p.name} takes a counter name and an optional window in us", self.loc(p.offset))
        name, loc = p.args[0], self.loc(p.arg_offsets[0])
        if not IDENT_RE.match(name):
            raise SubcError(f"bad counter name '{name}' (an identifier)", loc)
        if name in COUNTER_RESERVED or name.startswith("subc_"):
            raise SubcError(f"counter name '{name}' is reserved", loc)
        if name in self.spec.counters:
            raise SubcError(f"counter '{name}' is declared twice", loc)
        if len(p.args) == 2:
            self.spec.counters[name] = NamedCounter(name, self.window_arg(p, 1), loc)
        else:
            self.spec.counters[name] = c = NamedCounter(name, 0, loc)  # window: the spec's, set later
            unwindowed.append(c)

    def field_counter_pragma(self, p: Pragma, instances: dict[str, str]) -> None:
        """``query_field_counter(h.f[, window_us])`` (Camus): ``h.f`` is a range query field (unless
        declared already) whose aggregates use tumbling windows of ``window_us`` us."""
        if not 1 <= len(p.args) <= 2:
            raise SubcError("query_field_counter takes a field and an optional window in us", self.loc(p.offset))
        if p.args[0] not in self.spec.query_fields:
            self.query_field_pragma(Pragma("query_field", p.args[:1], p.arg_offsets[:1], p.offset), "range", instances)
        if len(p.args) == 2:
            self.spec.field_windows[p.args[0]] = self.window_arg(p, 1)

    def time_pragma(self, p: Pragma) -> None:
        """``query_time(h.f[, unit])``: a message's time for windows is query field ``h.f``."""
        spec = self.spec
        units = {"ns": 1, "us": 1000, "ms": 1_000_000, "s": 1_000_000_000}
        if not 1 <= len(p.args) <= 2:
            raise SubcError("query_time takes a field and an optional unit (ns, us, ms, s)", self.loc(p.offset))
        if spec.time_field is not None:
            raise SubcError("query_time is given twice", self.loc(p.offset))
        q = spec.query_fields.get(p.args[0])
        if q is None:
            raise SubcError(
                f"'{p.args[0]}' is not a query field (declare it with @pragma query_field first)",
                self.loc(p.arg_offsets[0]),
            )
        if q.alpha or q.width > 64:
            raise SubcError(
                f"time field '{q.name}' must be an integer field of at most 64 bits", self.loc(p.arg_offsets[0])
            )
        unit = p.args[1] if len(p.args) == 2 else "ns"
        if unit not in units:
            raise SubcError(f"unknown time unit '{unit}' (ns, us, ms, s)", self.loc(p.arg_offsets[1]))
        spec.time_field, spec.time_unit_ns = q.name, units[unit]

    def payload_pragma(self, p: Pragma, instances: dict[str, str]) -> None:
        if len(p.args) != 1 or not IDENT_RE.match(p.args[0]):
            raise SubcError("query_payload takes one header instance", self.loc(p.offset))
        if self.spec.headers and p.args[0] not in instances:
            raise SubcError(
                f"unknown header instance '{p.args[0]}' (not a member of the headers struct)",
                self.loc(p.arg_offsets[0]),
            )
        self.spec.payload_instances.add(p.args[0])

    def topic_pragma(self, p: Pragma) -> None:
        spec = self.spec
        if spec.topic is not None:
            raise SubcError("query_topic is given twice", self.loc(p.offset))
        if len(p.args) < 2:
            raise SubcError("query_topic takes the level-count field and at least one label field", self.loc(p.offset))
        seen: set[str] = set()
        for i, (a, off) in enumerate(zip(p.args, p.arg_offsets)):
            q = spec.query_fields.get(a)
            if q is None:
                raise SubcError(
                    f"'{a}' is not a query field (declare it with @pragma query_field first)", self.loc(off)
                )
            if a in seen:
                raise SubcError(f"'{a}' is named twice in query_topic", self.loc(off))
            seen.add(a)
            if q.alpha or q.scale is not None:
                raise SubcError(f"topic field '{a}' must be an integer field (not alpha, not scaled)", self.loc(off))
            if i and q.match_kind == "lpm":
                raise SubcError(f"label field '{a}' must be an exact or range field", self.loc(off))
            if i == 0 and (1 << q.width) <= len(p.args) - 1:
                raise SubcError(
                    f"level-count field '{a}' ({q.width} bits) cannot hold {len(p.args) - 1}", self.loc(off)
                )
            if i and q.width < 8:
                raise SubcError(f"label field '{a}' must be at least 8 bits wide", self.loc(off))
        spec.topic = TopicFields(p.args[0], tuple(p.args[1:]), self.loc(p.offset))

    def query_field_pragma(self, p: Pragma, kind: str, instances: dict[str, str]) -> None:
        spec = self.spec
        if not 1 <= len(p.args) <= 2:
            raise SubcError(f"{p.name} takes a field and an optional width", self.loc(p.offset))
        fname, floc = p.args[0], self.loc(p.arg_offsets[0])
        parts = fname.split(".")
        if len(parts) != 2 or not all(IDENT_RE.match(x) for x in parts):
            raise SubcError(f"expected a field 'header.field', found '{fname}'", floc)
        width = None
        if len(p.args) == 2:
            width = self.pragma_int(p.args[1])
            if width is None or not 0 < width <= MAX_TYPE_WIDTH:
                raise SubcError(f"bad width '{p.args[1]}'", self.loc(p.arg_offsets[1]))
        declared = None
        if spec.headers:
            htype = instances.get(parts[0])
            if htype is None:
                raise SubcError(f"unknown header instance '{parts[0]}' (not a member of the headers struct)", floc)
            header = spec.headers[htype]
            if not header.has(parts[1]):
                raise SubcError(f"unknown field '{parts[1]}' in header '{parts[0]}' ({htype})", floc)
            declared = header.width_of(parts[1])
            if declared is None:
                raise SubcError(f"field '{fname}' has no fixed width (varbit) and cannot be queried", floc)
            if declared == 0:
                raise SubcError(f"field '{fname}' is bit<0> and cannot be queried", floc)
            if width is not None and width != declared:
                raise SubcError(
                    f"width {width} does not fit field '{fname}', which is bit<{declared}>", self.loc(p.arg_offsets[1])
                )
            width = declared
        if width is None:
            raise SubcError(f"field '{fname}' needs a width (the spec declares no headers)", floc)
        if width > MAX_FIELD_WIDTH:
            raise SubcError(
                f"field '{fname}': field width {width} bits exceeds the limit of {MAX_FIELD_WIDTH} "
                f"(at most {MAX_FIELD_WIDTH} bits are supported)",
                floc,
            )
        if fname in spec.query_fields:
            raise SubcError(f"field '{fname}' is declared twice", floc)
        spec.query_fields[fname] = QueryField(fname, width, kind, floc)
