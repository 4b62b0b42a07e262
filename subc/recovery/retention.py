"""How much of a journal is kept (``--retain``) and sizes (``--segment-bytes``): parsing."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import SubcError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_BYTES = {"b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
_AMOUNT = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)")


@dataclass
class Retention:
    """How much of each stream's journal is kept: at most ``max_bytes`` (per stream) and
    messages no older than ``max_age_s`` seconds (whole segments are dropped, never the one
    being written)."""

    max_bytes: int | None = None
    max_age_s: float | None = None


def parse_bytes(text: str, what: str = "a size") -> int:
    """A size with a unit (``512MiB``, ``4G``, ``100000B``) in bytes; SubcError otherwise."""
    m = _AMOUNT.fullmatch(text.strip())
    if not m or m.group(2).lower() not in _BYTES:
        raise SubcError(f"{what} {text!r}: not a size (512MiB, 4G, 100000B)")
    return int(float(m.group(1)) * _BYTES[m.group(2).lower()])


def parse_retention(text: str) -> Retention:
    """``--retain``: ``SECONDS`` with a unit (``90s``, ``10m``, ``2h``, ``1d``), ``BYTES`` with
    one (``512MiB``, ``4G``, ``100000B``), or both, comma-separated.  Raises SubcError."""
    out = Retention()
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = _AMOUNT.fullmatch(part)
        unit = m.group(2).lower() if m else ""
        if m and unit in _UNITS:
            out.max_age_s = float(m.group(1)) * _UNITS[unit]
        elif m and unit in _BYTES:
            out.max_bytes = int(float(m.group(1)) * _BYTES[unit])
        else:
            raise SubcError(
                f"--retain {text!r}: {part!r} is neither a time (90s, 10m, 2h, 1d) nor a size (512MiB, 4G, 100000B)"
            )
    return out
