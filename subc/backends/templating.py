"""The Jinja environment every back end renders its generated files with."""

from __future__ import annotations

from pathlib import Path

import jinja2


def environment(templates: Path) -> jinja2.Environment:
    """The Jinja environment over the folder ``templates`` (undefined variables are errors; blocks
    keep their newlines, so the generated text is what the template shows)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )
