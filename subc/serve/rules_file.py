"""``subc serve --rules FILE``: subscriptions made at every start, never stored nor removable by a
request (see docs/serve.md)."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import SubcError
from ..lang.limits import Limits
from ..spec.model import Spec
from .endpoints import SOUP_PREFIX
from .protocol import ProtocolError, parse_request
from .store import Stored

RULES_SOURCE = "rules-file"  # the source of --rules subscriptions
SOUP_TO = re.compile(r"\s+TO\s+soup:([!-~]{1,6})\s*\Z", re.IGNORECASE)  # --rules: a SoupBinTCP user's stream


def read_rules_file(path: str, spec: Spec, limits: Limits, soup: bool, first_id: int) -> list[Stored]:
    """The subscriptions of ``path``: one per line, ``<condition> TO <ip>:<port>`` or
    ``<condition> TO soup:<user>`` (a SoupBinTCP user's stream; ``soup``: the daemon serves
    SoupBinTCP, ``--journal --soup``), blank lines and ``#``/``//`` comments skipped; ids from
    ``first_id`` on, in order, source :data:`RULES_SOURCE`, no expiry.  Raises SubcError
    (``path:line:col: error: ...``) on a condition that does not parse, a missing ``TO``, or
    ``TO soup:`` without ``soup``."""
    out: list[Stored] = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith(("#", "//")):
            continue
        to_soup = SOUP_TO.search(line)
        try:
            text = line[: to_soup.start()] if to_soup else line
            req = parse_request(("SUBSCRIBE " + text).encode(), spec, limits)
        except ProtocolError as e:
            raise SubcError(f"{path}:{n}:{max(1, e.column - 10)}: error: {e.message}") from None
        if to_soup is not None:
            if not soup:
                raise SubcError(f"{path}:{n}:{to_soup.start() + 2}: error: TO soup:<user> needs --journal and --soup")
            to = (SOUP_PREFIX + to_soup.group(1), 0)
        elif req.to is None:
            raise SubcError(f"{path}:{n}:1: error: a subscription of --rules needs TO <ip>:<port> or TO soup:<user>")
        else:
            to = req.to
        out.append(Stored(first_id + len(out), req.text, to[0], to[1], RULES_SOURCE, None))
    return out
