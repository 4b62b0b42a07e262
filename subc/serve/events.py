"""The daemon's structured logs: one JSON object per line (:class:`JsonFormatter`), written by
:func:`event` from every thread of ``subc serve``."""

from __future__ import annotations

import json
import logging

log = logging.getLogger("subc.serve")


class JsonFormatter(logging.Formatter):
    """Structured logs: one JSON object per line (``ts``, ``level``, ``event`` and its fields)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": round(record.created, 6), "level": record.levelname.lower(), "event": record.getMessage()}
        doc.update(getattr(record, "fields", {}))
        return json.dumps(doc, separators=(",", ":"))


def event(level: int, name: str, **fields) -> None:
    """Log event ``name`` at ``level`` with ``fields`` (a JSON object per line under :class:`JsonFormatter`)."""
    log.log(level, name, extra={"fields": fields})
