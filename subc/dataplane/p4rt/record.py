"""The writer's record of what a switch holds, so that an update need not read every table back.

``subc load --p4runtime`` and ``subc update --p4runtime`` write, after their last write was
acknowledged, what the switch then holds (every entry with the states and multicast groups the
switch numbers them by, the spare root's entries, the root, each state's signature: a
:class:`~subc.backends.p4.state_index.StateIndex`) into a *record*: one file per switch and
device (:func:`record_path`), written atomically (a temporary file beside it, then a rename).
An update plans from the record instead of reading the 36,000 entries of a 100,000-rule set
back (seconds on BMv2), once it has checked, with one read, that the switch still runs the
recorded program (its P4Info, :func:`program_digest`) from the recorded root (the default
action of ``subc_root``).

A record is trusted only while it is known to be true: it is removed before an update's first
write and written again after its last (a writer that dies between the two leaves none, and the
next update reads the switch); a missing, unreadable or mismatched record makes the update read
the switch (as without a record); any write the switch rejects makes the writer read the switch
and plan again from what it holds (another controller may have written).  ``subc verify``
compares the record with the switch (:func:`holding_differences`) and removes a record that
differs.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ...backends.output import atomic_file
from ...backends.p4.entries_doc import EntriesDoc
from ...backends.p4.state_index import StateIndex

FORMAT = "subc-switch-record"
VERSION = 1


def default_record_dir() -> Path:
    """``$SUBC_STATE_DIR/p4runtime``, else ``/var/lib/subc/p4runtime`` (root) or
    ``$XDG_STATE_HOME/subc/p4runtime`` (``~/.local/state`` when unset)."""
    base = os.environ.get("SUBC_STATE_DIR")
    if base:
        return Path(base) / "p4runtime"
    if os.geteuid() == 0:
        return Path("/var/lib/subc/p4runtime")
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "subc" / "p4runtime"


def record_path(addr: str, device_id: int, record_dir: str | Path | None = None) -> Path:
    """The record file of device ``device_id`` of the switch at ``addr`` (``HOST:PORT``) in
    ``record_dir`` (default :func:`default_record_dir`)."""
    safe = "".join(c if c.isalnum() or c in ".-" else "_" for c in addr)
    return Path(record_dir or default_record_dir()) / f"{safe}-dev{device_id}.json"


def program_digest(p4info) -> str:
    """SHA-256 (hex) of the deterministic serialization of the P4Info message ``p4info``: the
    program a record was written for."""
    return hashlib.sha256(p4info.SerializeToString(deterministic=True)).hexdigest()


@dataclass
class SwitchRecord:
    """What device ``device`` of the switch at ``switch`` holds (``index``: its entries by state, in
    the switch's numbering, :class:`~.state_index.StateIndex`) while it runs the program of
    P4Info digest ``program``."""

    switch: str
    device: int
    program: str
    index: StateIndex


def read_record(path: Path, addr: str, device_id: int, program: str) -> tuple[SwitchRecord | None, str]:
    """(the record at ``path``, "") when it is one of this switch, device and program; else (None,
    why not: missing, unreadable, another switch or program).  Never raises for a bad file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, "no record"
    except OSError as e:
        return None, f"record {path} unreadable ({e})"
    try:
        index, header = StateIndex.from_bytes(raw)
        if header.get("record") != FORMAT or header.get("record_version") != VERSION:
            return None, f"record {path} is not a {FORMAT} version {VERSION} document"
        if (header.get("switch"), header.get("device")) != (addr, device_id):
            return None, f"record {path} is of {header.get('switch')} device {header.get('device')}"
        if header.get("program") != program:
            return None, "the switch runs another program than the record's"
    except (KeyError, TypeError, ValueError) as e:
        return None, f"record {path} unreadable ({e})"
    return SwitchRecord(addr, device_id, program, index), ""


def write_record(path: Path, record: SwitchRecord) -> None:
    """Write ``record`` to ``path`` atomically (creating its directory).  OSError passes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {
        "record": FORMAT,
        "record_version": VERSION,
        "switch": record.switch,
        "device": record.device,
        "program": record.program,
    }
    with atomic_file(path, "wb") as f:
        f.write(record.index.to_bytes(extra))


def forget_record(path: Path) -> None:
    """Remove the record at ``path`` (none is fine): done before an update's first write."""
    path.unlink(missing_ok=True)


def holding_differences(switch: EntriesDoc, record: EntriesDoc) -> list[str]:
    """How ``record`` differs from what the switch holds (``switch``, read back), exactly (the
    same state and group numbers): one line per table, the groups and the root; empty when equal."""
    from .compare import rows  # (verify's: an update need not import it)

    out = []
    have: dict[str, set] = {}
    said: dict[str, set] = {}
    for doc, into in ((switch, have), (record, said)):
        for r in rows(doc):
            into.setdefault(r.table, set()).add((r.key, r.action, r.params))
    for name in sorted(set(have) | set(said)):
        a, b = have.get(name, set()), said.get(name, set())
        if a != b:
            out.append(
                f"{name}: {len(b - a)} recorded entries are not on the switch, {len(a - b)} on it are not recorded"
            )
    if switch.groups != record.groups:
        out.append(f"multicast groups: the switch has {switch.groups}, the record {record.groups}")
    if switch.initial_state != record.initial_state:
        out.append(f"root: the switch's is state {switch.initial_state}, the record's {record.initial_state}")
    return out
