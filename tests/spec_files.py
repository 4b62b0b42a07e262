"""A spec written across several files, as P4 programmers split theirs (Camus's programs pull their
headers and parser from other files with ``#include``): a rendered spec (``tests/spec_model.py``)
cut at top-level blank lines into parts that ``#include`` one another.

:func:`layouts` draws how (where the cuts are, nested or flat includes, parts beside the spec, in
a subfolder or in a ``-I`` folder, ``"..."`` or ``<...>``, include guards or not);
:func:`split_spec` writes the files.  The main file is always ``spec.p4``, so that a split spec
and its one-file original are read under the same path.  Like ``spec_model``, nothing here
imports ``subc``: textual inclusion is what the C preprocessor does, so the one-file spec is what
the split files mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st


def cut_points(text: str) -> list[int]:
    """Indices of the blank lines of ``text`` outside braces and comments (where a file may end)."""
    out, depth, comment = [], 0, False
    for i, line in enumerate(text.split("\n")):
        if not comment and depth == 0 and not line.strip() and i > 0:
            out.append(i)
        comment = (comment or "/*" in line) and "*/" not in line
        depth += line.count("{") - line.count("}")
    return out


@dataclass(frozen=True)
class Layout:
    """How a spec is split: the blank lines ``cuts`` where a part ends; ``nested`` (each part
    includes the next) or flat (the main file includes every part); ``where`` the parts are
    (``same`` folder, ``sub``folder ``inc/`` named with it, or ``include_dir`` ``hdrs/`` given with
    ``-I``); ``angle``: ``<part.p4>`` (only with ``-I``); ``guards``: include guards."""

    cuts: tuple[int, ...]
    nested: bool
    where: str
    angle: bool
    guards: bool


@st.composite
def layouts(draw, text: str) -> Layout:
    """A :class:`Layout` for the rendered spec ``text`` (1 to 4 cuts)."""
    points = cut_points(text)
    cuts = draw(st.lists(st.sampled_from(points), min_size=1, max_size=4, unique=True)) if points else []
    where = draw(st.sampled_from(["same", "sub", "include_dir"]))
    return Layout(
        tuple(sorted(cuts)),
        draw(st.booleans()),
        where,
        where == "include_dir" and draw(st.booleans()),
        draw(st.booleans()),
    )


def split_spec(text: str, layout: Layout, root: Path) -> list[str]:
    """Write ``text`` split as ``layout`` says under folder ``root`` (main file ``spec.p4``);
    returns the ``-I`` folders (relative to ``root``) the split spec needs."""
    lines = text.split("\n")
    bounds = [0, *layout.cuts, len(lines)]
    pieces = [lines[a:b] for a, b in zip(bounds, bounds[1:])]
    folder = {"same": "", "sub": "inc", "include_dir": "hdrs"}[layout.where]
    (root / folder).mkdir(parents=True, exist_ok=True)

    def directive(k: int, from_main: bool) -> str:
        name = f"part{k}.p4"
        if layout.angle:
            return f"#include <{name}>"
        if layout.where == "sub" and from_main:
            return f'#include "inc/{name}"'
        return f'#include "{name}"'

    main = pieces[0]
    parts = pieces[1:]
    if layout.nested:
        main = main + [directive(1, True)]
    else:
        main = main + [directive(k, True) for k in range(1, len(parts) + 1)]
    (root / "spec.p4").write_text("\n".join(main) + "\n")
    for k, piece in enumerate(parts, 1):
        body = list(piece)
        if layout.nested and k < len(parts):
            body.append(directive(k + 1, False))
        if layout.guards:
            body = [f"#ifndef PART{k}_P4", f"#define PART{k}_P4", *body, "#endif"]
        (root / folder / f"part{k}.p4").write_text("\n".join(body) + "\n")
    return [folder] if layout.where == "include_dir" else []
