"""The subscriptions of ``subc serve``, stored in SQLite (WAL mode) under ``--state DIR``.

One table: ``subscription(id, condition, ip, port, source, expires)`` (``expires``: Unix time in
s, NULL for a subscription without a lease).  Every change is committed before the request is
acknowledged, so a daemon that restarts finds every subscription it acknowledged.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS subscription (
    id INTEGER PRIMARY KEY,
    condition TEXT NOT NULL,
    ip TEXT NOT NULL,
    port INTEGER NOT NULL,
    source TEXT NOT NULL,
    expires REAL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass
class Stored:
    """A stored subscription: ``id``, condition ``text``, endpoint ``ip``:``port``, the
    request's ``source`` ('ip:port'), lease ``expires`` (Unix s, or None)."""

    id: int
    text: str
    ip: str
    port: int
    source: str
    expires: float | None


class Store:
    """SQLite store at ``DIR/subscriptions.db`` (``None``: in memory, nothing survives)."""

    def __init__(self, state_dir: str | Path | None):
        if state_dir is None:
            path = ":memory:"
        else:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
            path = str(Path(state_dir) / "subscriptions.db")
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.lock = threading.Lock()
        with self.lock:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)

    def next_id(self) -> int:
        with self.lock:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()
            n = int(row[0]) if row else 1
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('next_id', ?)", (str(n + 1),))
            return n

    def add(self, s: Stored) -> None:
        with self.lock:
            self.db.execute("INSERT INTO subscription VALUES (?, ?, ?, ?, ?, ?)",
                            (s.id, s.text, s.ip, s.port, s.source, s.expires))

    def remove(self, sub_id: int) -> None:
        with self.lock:
            self.db.execute("DELETE FROM subscription WHERE id = ?", (sub_id,))

    def renew(self, ids: list[int], expires: float | None) -> None:
        with self.lock:
            self.db.execute("BEGIN")
            self.db.executemany("UPDATE subscription SET expires = ? WHERE id = ?", [(expires, i) for i in ids])
            self.db.execute("COMMIT")

    def all(self) -> list[Stored]:
        with self.lock:
            rows = self.db.execute("SELECT id, condition, ip, port, source, expires FROM subscription ORDER BY id")
            return [Stored(*r) for r in rows.fetchall()]

    def close(self) -> None:
        with self.lock:
            self.db.close()
