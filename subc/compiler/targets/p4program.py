"""P4_16 program generation from Jinja templates (``subc/templates/p4``).

``render_program`` gives a whole program for BMv2 (``v1model.p4``) or Tofino (``tna.p4``) when
the spec has headers and a parser, else the subscription control block only.  Every identifier
that reaches a template comes from the spec parser (already a P4 identifier) or from subc, and is
checked again at the template boundary (:mod:`.safety`); rule literals reach it only as integers.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from ... import __version__
from ..driver import CompileResult
from .entries import bfrt_key_name
from .safety import check_action, check_pipeline, comment_text, identifier

TEMPLATES = Path(__file__).resolve().parent.parent.parent / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The Jinja environment over ``subc/templates`` (undefined variables are errors)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def _call(action: tuple[str, tuple]) -> str:
    check_action(action, "default")
    name, params = action
    return f"{name}({', '.join(str(v) for _, v in params)})"


def _table_ctx(t) -> dict:
    return {
        "name": t.name,
        "key_fields": [
            {"name": k.name, "match_kind": k.match_kind, "bfrt_name": bfrt_key_name(k.name)} for k in t.keys
        ],
        "actions": t.actions,
        "default_action": t.default_action,
        "default_call": _call(t.default_action),
        "size": t.size,
    }


def program_context(res: CompileResult, rules_path: str, tna: bool) -> dict:
    """The template context for ``res`` (see the templates for the names used)."""
    spec, pipe = res.spec, res.pipeline
    check_pipeline(pipe)
    parser = spec.parser
    ctx = {
        "version": __version__,
        "tna": tna,
        "rules_path": comment_text(rules_path),
        "spec_path": comment_text(spec.path),
        "n_rules": len(res.rules),
        "field_order": pipe.field_order,
        "state_width": pipe.state_width,
        "code_width": pipe.code_width,
        "uses_code": any(t.role == "code" for t in pipe.tables),
        "tables": [_table_ctx(t) for t in pipe.tables],
        "steps": pipe.steps,
        "root_state": pipe.root_state,
        "headers": pipe.headers,
        "hdr": pipe.hdr,
        "meta": pipe.meta,
        "spec_actions": [a.text for a in spec.actions.values()],
        "default_call": _call(pipe.default_action),
        "headers_type": parser.headers_type if parser else "headers",
        "packet": parser.packet if parser else "packet",
        "std_meta": (parser.std_meta if parser and parser.std_meta else "standard_metadata"),
    }
    for name in (ctx["hdr"], ctx["meta"], ctx["packet"], ctx["std_meta"], ctx["headers_type"]):
        identifier(name, "parser parameter")
    for a in spec.actions.values():
        identifier(a.name, "spec action")
    if parser is not None:
        rename = (lambda n: "subc_spec_start" if n == "start" else n) if tna else (lambda n: n)
        for s in parser.states:
            identifier(s.name, "parser state")
            for _, t in s.transition.cases:
                identifier(t, "parser state")
        ctx["states"] = [
            {
                "name": rename(s.name),
                "statements": s.statements,
                "select": s.transition.select_text,
                "cases": [(ks, rename(t)) for ks, t in s.transition.cases],
            }
            for s in parser.states
        ]
        ctx["decls"] = [text for kind, name, text in spec.decls if not (kind == "struct" and name == parser.meta_type)]
        ctx["meta_members"] = [raw for _, _, raw in spec.structs.get(parser.meta_type or "", [])]
    return ctx


def render_program(res: CompileResult, rules_path: str) -> tuple[str, str]:
    """(file name, P4 source) for ``res``: ``subc.p4`` or, for a pragma-only spec, ``subc_control.p4``."""
    tna = res.target == "tofino"
    ctx = program_context(res, rules_path, tna)
    env = environment()
    if not res.spec.whole_program:
        return "subc_control.p4", env.get_template("p4/control_only.p4.j2").render(ctx)
    template = "p4/tna.p4.j2" if tna else "p4/v1model.p4.j2"
    return "subc.p4", env.get_template(template).render(ctx)
