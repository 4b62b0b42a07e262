"""The subscriptions of ``subc serve``, stored in SQLite (WAL mode) under ``--state DIR``.

Tables: ``subscription(id, condition, ip, port, source, expires, filter)`` (``expires``: Unix time
in s, NULL for a subscription without a lease; ``filter``: a topic subscription's filter, whose
``condition`` is then its ``WHERE`` part or empty), ``endpoint(ip, port, sid)`` (the subscriber
number each delivery endpoint has in the data plane, kept so that a restarted daemon gives every
endpoint the number the pinned maps' leaves use), ``label(name, label)`` (the topic level names'
labels, which publishers keep) and ``registration(topic, source, expires)``.  Every change is
committed before the request
is acknowledged, so a daemon that restarts finds every subscription it acknowledged.
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
CREATE TABLE IF NOT EXISTS label (name TEXT PRIMARY KEY, label INTEGER NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS registration (topic TEXT NOT NULL, source TEXT NOT NULL, expires REAL,
                                         PRIMARY KEY (topic, source));
CREATE TABLE IF NOT EXISTS endpoint (ip TEXT NOT NULL, port INTEGER NOT NULL, sid INTEGER NOT NULL UNIQUE,
                                     PRIMARY KEY (ip, port));
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
    filter: str | None = None

    def row(self) -> tuple:
        return (self.id, self.text, self.ip, self.port, self.source, self.expires, self.filter)


@dataclass
class TopicChanges:
    """Topic state to commit with a change: ``labels`` given (name -> label), names
    ``forgotten``, the ``next_label``, and ``registrations`` set ((topic, source) -> expires) or
    removed ((topic, source) -> :data:`REMOVED`)."""

    labels: dict[str, int]
    forgotten: set[str]
    next_label: int
    registrations: dict[tuple[str, str], float | None | str]


#: a registration to delete (:class:`TopicChanges`)
REMOVED = "removed"


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
        self._ckpt: sqlite3.Connection | None = None
        with self.lock:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            if state_dir is not None:
                # checkpoints (which wait for the disk) by checkpoint(), off the committing thread
                self.db.execute("PRAGMA wal_autocheckpoint=0")
                self._ckpt = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self.db.executescript(SCHEMA)
            cols = {r[1] for r in self.db.execute("PRAGMA table_info(subscription)")}
            if "filter" not in cols:  # a store of a daemon before topics
                self.db.execute("ALTER TABLE subscription ADD COLUMN filter TEXT")

    def next_id(self) -> int:
        with self.lock:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()
            n = int(row[0]) if row else 1
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('next_id', ?)", (str(n + 1),))
            return n

    def add(self, s: Stored) -> None:
        with self.lock:
            self.db.execute("INSERT INTO subscription VALUES (?, ?, ?, ?, ?, ?, ?)", s.row())

    def remove(self, sub_id: int) -> None:
        with self.lock:
            self.db.execute("DELETE FROM subscription WHERE id = ?", (sub_id,))

    def renew(self, ids: list[int], expires: float | None) -> None:
        with self.lock:
            self.db.execute("BEGIN")
            self.db.executemany("UPDATE subscription SET expires = ? WHERE id = ?", [(expires, i) for i in ids])
            self.db.execute("COMMIT")

    def commit(
        self,
        adds: list[Stored],
        removes: list[int],
        endpoints: dict[tuple[str, int], int | None],
        next_id: int | None = None,
        topics: TopicChanges | None = None,
        meta: dict[str, str] | None = None,
        renewed: list[tuple[int, float | None]] | None = None,
    ) -> None:
        """One transaction: insert ``adds``, delete the ids ``removes``, set (sid) or forget
        (None) the ``endpoints``, record the next free subscription id, the ``topics`` changes,
        the ``meta`` values (a cluster's applied revision) and the lease ends of ``renewed``
        ((id, expires))."""
        with self.lock:
            self.db.execute("BEGIN")
            try:
                if next_id is not None:
                    self.db.execute("INSERT OR REPLACE INTO meta VALUES ('next_id', ?)", (str(next_id),))
                for k, v in (meta or {}).items():
                    self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (k, v))
                if renewed:
                    self.db.executemany(
                        "UPDATE subscription SET expires = ? WHERE id = ?", [(e, i) for i, e in renewed]
                    )
                self.db.executemany("DELETE FROM subscription WHERE id = ?", [(i,) for i in removes])
                self.db.executemany("INSERT INTO subscription VALUES (?, ?, ?, ?, ?, ?, ?)", [s.row() for s in adds])
                if topics is not None:
                    self._topics(topics)
                for (ip, port), sid in endpoints.items():
                    self.db.execute("DELETE FROM endpoint WHERE ip = ? AND port = ?", (ip, port))
                    if sid is not None:
                        self.db.execute("INSERT INTO endpoint VALUES (?, ?, ?)", (ip, port, sid))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def _topics(self, t: TopicChanges) -> None:
        db = self.db
        db.executemany("DELETE FROM label WHERE name = ?", [(n,) for n in t.forgotten])
        db.executemany("INSERT OR REPLACE INTO label VALUES (?, ?)", list(t.labels.items()))
        db.execute("INSERT OR REPLACE INTO meta VALUES ('next_label', ?)", (str(t.next_label),))
        for (topic, source), exp in t.registrations.items():
            if exp == REMOVED:
                db.execute("DELETE FROM registration WHERE topic = ? AND source = ?", (topic, source))
            else:
                db.execute("INSERT OR REPLACE INTO registration VALUES (?, ?, ?)", (topic, source, exp))

    def labels(self) -> tuple[dict[str, int], int]:
        """(level name -> label, the next label never given)."""
        with self.lock:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'next_label'").fetchone()
            return dict(self.db.execute("SELECT name, label FROM label").fetchall()), int(row[0]) if row else 1

    def registrations(self) -> list[tuple[str, str, float | None]]:
        """(topic, source address, expires) of every stored registration."""
        with self.lock:
            return self.db.execute("SELECT topic, source, expires FROM registration ORDER BY topic").fetchall()

    def meta(self, key: str) -> str | None:
        """A value of the ``meta`` table (``next_id``, ``next_label``, a cluster's
        ``cluster_revision``), or None."""
        with self.lock:
            row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            return row[0] if row else None

    def next_free_id(self) -> int:
        """The next subscription id: past every id ever given (stored or recorded)."""
        with self.lock:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()
            top = self.db.execute("SELECT MAX(id) FROM subscription").fetchone()[0]
            return max(int(row[0]) if row else 1, (top or 0) + 1)

    def endpoints(self) -> dict[tuple[str, int], int]:
        """The endpoints' subscriber numbers: (ip, port) -> sid."""
        with self.lock:
            return {(ip, port): sid for ip, port, sid in self.db.execute("SELECT ip, port, sid FROM endpoint")}

    def all(self) -> list[Stored]:
        with self.lock:
            rows = self.db.execute(
                "SELECT id, condition, ip, port, source, expires, filter FROM subscription ORDER BY id"
            )
            return [Stored(*r) for r in rows.fetchall()]

    def checkpoint(self) -> None:
        """Copy the committed transactions of the write-ahead log into the database (a passive
        checkpoint, on a connection of its own: commits go on meanwhile).  Call it from a thread
        that does not commit, about once a second."""
        if self._ckpt is not None:
            self._ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def close(self) -> None:
        with self.lock:
            if self._ckpt is not None:
                self._ckpt.close()
                self._ckpt = None
            self.db.close()
