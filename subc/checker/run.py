"""``subc check``: everything a CI job should know about a rule set before it reaches a switch.

:func:`check` parses every rule file (rule by rule after a failure, so that every syntax and
semantic error is reported), runs the analyses of :mod:`.analysis` on the rules that parsed,
compiles them for the target and estimates its fit (:mod:`.fit`).  Unreadable input (a missing
file, a spec that does not parse) raises :class:`~subc.errors.SubcError`: exit status 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..ir.aggregates import is_state_field, plan_state
from ..compiler.gcpause import paused_gc
from ..backends.files import STATEFUL_TARGETS
from ..backends.p4.backend import check_tofino_state
from ..lang.limits import DEFAULT_LIMITS, LimitError, Limits
from ..lang.rules import parse_rules
from ..spec.front_end import Spec, load_spec
from ..errors import SubcError
from .analysis import RuleSpace, changes_nothing, conflicts, unsatisfiable
from .diagnostics import Diagnostic, to_json
from ..compiler.target import Target


@dataclass
class CheckReport:
    """The result of :func:`check`: diagnostics sorted by location, rule and file counts, the
    target and its fit report (None when the rules did not compile)."""

    target: str
    files: list[str]
    rules: int = 0
    diagnostics: list[Diagnostic] = field(default_factory=list)
    target_fit: dict | None = None

    def count(self, severity: str) -> int:
        return sum(1 for d in self.diagnostics if d.severity == severity)

    def exit_status(self, strict: bool = False) -> int:
        """1 with errors (or, ``strict``, warnings), else 0."""
        return 1 if self.count("error") or (strict and self.count("warning")) else 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SubcError(f"cannot read rules {path}: {e}") from e


def parse_all(paths: Sequence[str], spec: Spec, limits: Limits = DEFAULT_LIMITS) -> tuple[list, list[Diagnostic]]:
    """(rules of all files, numbered in order, and a diagnostic per error).  A file over a limit
    gets one 'limit' error and contributes no rule; a file with errors is parsed rule by rule."""
    from ..analysis.validate import Piece, statements

    rules: list = []
    diags: list[Diagnostic] = []
    for path in paths:
        text = _read(path)
        try:
            rules += parse_rules(text, spec, path, first_index=len(rules), limits=limits)
            continue
        except LimitError as e:  # the whole file is over a limit: no rule of it is checked
            diags.append(Diagnostic.from_error(e, "limit"))
            continue
        except SubcError:
            pass
        for st in statements(Piece(path, 0, text)):
            try:
                rules += parse_rules(st.text, spec, path, st.line_offset, len(rules), limits)
            except SubcError as e:
                diags.append(Diagnostic.from_error(e))
    return rules, diags


def check(
    paths: Sequence[str],
    spec_path: str,
    target: str = "bmv2",
    limits: Limits = DEFAULT_LIMITS,
    load_ebpf: bool = True,
    max_messages: int = 8,
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
) -> CheckReport:
    """Check the rule files ``paths`` against the spec at ``spec_path`` (preprocessed with the
    ``-I`` folders ``include_dirs`` and the ``-D`` macros ``defines``) for ``target``.

    Raises :class:`SubcError` when the spec or a rule file cannot be read or the spec does not
    parse (exit status 2); everything else is a diagnostic of the report.
    """
    from ..compiler.driver import compile_rules
    from . import fit

    spec = load_spec(spec_path, include_dirs, defines)
    rep = CheckReport(target, list(paths))
    with paused_gc():
        rules, rep.diagnostics = parse_all(paths, spec, limits)
        rep.rules = len(rules)
        # comparisons on state are analysed as predicates on the state values (free variables)
        rewritten, plan, fields = plan_state(rules, spec)
        space = RuleSpace(rewritten[: len(rules)], spec, fields) if plan is not None else RuleSpace(rules, spec)
        rep.diagnostics += unsatisfiable(space)
        rep.diagnostics += changes_nothing(space)
        found = conflicts(space)
        _example_messages(spec, found)
        rep.diagnostics += found
        if not any(d.severity == "error" for d in rep.diagnostics):
            try:
                res = compile_rules(rules, spec, target, limits=limits)
            except SubcError as e:
                rep.diagnostics.append(Diagnostic.from_error(e, "limit" if isinstance(e, LimitError) else "target-fit"))
                res = None
            if res is not None:
                if target == Target.TOFINO:
                    rep.target_fit, more = fit.tofino_fit(res, max_messages)
                elif target == Target.EBPF:
                    rep.target_fit, more = fit.ebpf_fit(res, str(paths[0]) if paths else "", load_ebpf)
                else:
                    rep.target_fit, more = fit.bmv2_fit(res)
                rep.diagnostics += more
                if res.ir.state is not None:
                    rep.target_fit["state"] = fit.state_fit(res)
                    if target not in STATEFUL_TARGETS:
                        first = next(r for r in res.rules if r.index == res.ir.state.instances[0].rules[0])
                        rep.diagnostics.append(
                            Diagnostic(
                                "error",
                                "target-fit",
                                f"the rules compare state (aggregates), which the {target} target does not support yet "
                                f"(supported: {', '.join(STATEFUL_TARGETS)})",
                                first.location,
                            )
                        )
                    elif target == Target.TOFINO:
                        rep.diagnostics += _tofino_state(res, rep.target_fit, max_messages)
    rep.diagnostics.sort(key=Diagnostic.sort_key)
    return rep


def _tofino_state(res, target_fit: dict, max_messages: int) -> list[Diagnostic]:
    """Errors for comparisons on state Tofino cannot run (:func:`~subc.backends.p4.backend.check_tofino_state`)
    and for a pipeline whose header-field and state stages together exceed Tofino 2's."""
    first = next(r for r in res.rules if r.index == res.ir.state.instances[0].rules[0])
    out = []
    try:
        check_tofino_state(res, max_messages, None)
    except SubcError as e:
        out.append(Diagnostic("error", "target-fit", e.message, first.location))
    st = target_fit["state"]["tofino"]
    total = target_fit["stages"]["needed"] + st["stages"]
    st["pipeline_stages"] = total
    limits = target_fit["stages"]["limits"]
    need = (
        f"the field stages and the comparisons on state need about {total} MAU stages "
        f"({st['stateful_alus']} stateful ALUs)"
    )
    if total > limits["Tofino 2"]:
        out.append(
            Diagnostic("error", "target-fit", f"{need}: more than Tofino 2 has ({limits['Tofino 2']})", first.location)
        )
    elif total > limits["Tofino 1"]:
        out.append(
            Diagnostic(
                "warning", "target-fit", f"{need}: Tofino 2 only (Tofino 1 has {limits['Tofino 1']})", first.location
            )
        )
    return out


def _example_messages(spec: Spec, diagnostics: list[Diagnostic]) -> None:
    """Give each diagnostic with an example packet the bytes of that message, built with the spec
    (:class:`~subc.wire.encoder.MessageEncoder`), when the spec describes a MoldUDP64 feed."""
    if not any(d.example for d in diagnostics):
        return
    from ..wire.decoder import MessageDecoder
    from ..wire.encoder import MessageEncoder

    try:
        encoder = MessageEncoder(MessageDecoder(spec))
    except SubcError:
        return  # a pragma-only spec, or no MoldUDP64 feed: the field values are the example
    for d in diagnostics:
        if d.example:
            msg = encoder.encode({k: v for k, v in d.example.items() if not is_state_field(k)})
            if msg is not None:
                d.example_message = msg.hex()
                d.notes.append(f"example message (hex, as the spec frames it): {d.example_message}")


def report_json(rep: CheckReport) -> dict:
    """The ``--format json`` document (format ``subc-check``, see :mod:`.diagnostics`)."""
    return {
        "format": "subc-check",
        "version": 1,
        "target": rep.target,
        "files": rep.files,
        "rules": rep.rules,
        "summary": {"errors": rep.count("error"), "warnings": rep.count("warning"), "notes": rep.count("note")},
        "diagnostics": [to_json(d) for d in rep.diagnostics],
        "target_fit": rep.target_fit,
    }


def summary_line(rep: CheckReport) -> str:
    """One line: rules, files, errors, warnings and the target's headline figure."""
    s = (
        f"subc check: {rep.rules:,} rules in {len(rep.files)} file(s) for {rep.target}: "
        f"{rep.count('error')} error(s), {rep.count('warning')} warning(s)"
    )
    f = rep.target_fit or {}
    if f.get("model") == Target.TOFINO:
        s += f"; about {f['stages']['needed']} MAU stages (Tofino 1: 12, Tofino 2: 20)"
        from .fit import message_stages_text

        s += "; " + message_stages_text(f) if message_stages_text(f) else ""
        st = f.get("state", {}).get("tofino")
        if st:
            s += (
                f"; comparisons on state: {st['stateful_alus']} stateful ALUs (registers), about {st['stages']} more "
                f"stages ({st['pipeline_stages']} in all)"
            )
    if "multicast_groups" in f:
        s += f"; {f['multicast_groups']['used']:,} multicast groups"
    if f.get("model") == Target.EBPF and f.get("instructions"):
        s += "; " + ", ".join(f"{k} {v['xlated_insns']:,} instructions" for k, v in f["instructions"].items())
    return s
