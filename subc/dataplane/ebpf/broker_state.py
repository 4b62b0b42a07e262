"""A loaded eBPF broker's state and pinned maps, read and written by every later command.

The broker's home (:mod:`.broker_home`) holds its pins (``<bpffs>/subc/net<netns inode>/IF/``)
and its state directory (``<run dir>/net<netns inode>/IF/``: ``state.json``, the generation,
capacities, endpoints, program ids and the network namespace's cookie, and the ``maps.json`` of
the live rule set).  :func:`claim_home` frees a home for a load, :func:`write_state` and
:func:`read_state` keep the state (refusing a stale one), :func:`pinned_maps` opens the maps
through their pins.
"""

from __future__ import annotations

import json
import os

from ...backends.ebpf.maps_doc import MapsDoc
from ...errors import SubcError
from . import attach
from .bpf import Map
from .bpf_objects import obj_get
from .broker_home import BrokerHome, broker_home, stale_reason

#: The journal service's status in the state directory (written by :mod:`subc.recovery.service`,
#: read by ``subc stats``).
JOURNAL_STATUS = "journal.json"


def read_journal_status(home: BrokerHome) -> dict | None:
    """The last status the broker's journal service wrote, or None (no service ran)."""
    try:
        doc = json.loads((home.state_dir / JOURNAL_STATUS).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def claim_home(home: BrokerHome) -> list[str]:
    """Make ``home`` free for a broker about to be loaded there (the caller holds
    :func:`~.broker_home.home_lock`): clear the brokers whose device is gone
    (:func:`~.attach.clear_dead`) and a stale broker in this very home
    (:func:`~.broker_home.stale_reason`; pins without a state, left by an interrupted load).
    Returns what was cleared, as messages.  Raises SubcError when a live broker is loaded there."""
    iface = home.iface
    cleared = [f"cleared the broker {k}: its interface is gone" for k in attach.clear_dead(home.bpffs, home.run)]
    if home.exists():
        try:
            state = json.loads(home.state_path.read_text())
        except (OSError, ValueError):
            state = None
        link = attach.link_device(home)
        if state is None:
            reason = None if link else "it has pins but no state (an interrupted load)"
        else:
            reason = stale_reason(state, home, attach.ifindex_or_none(iface), link)
        if reason is None:
            raise SubcError(
                f"subc is already loaded on {iface} in this network namespace "
                f"({home.pins}): use subc update, or subc unload first"
            )
        attach.remove(home)
        cleared.append(f"cleared the stale broker state of {iface} ({home.state_dir}): {reason}")
    return cleared


def write_state(home: BrokerHome, state: dict, doc: MapsDoc) -> None:
    """Write ``state.json`` and ``maps.json`` of a loaded broker (each replaced atomically)."""
    d = home.state_dir
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, d / "state.json")
    (d / "maps.json.tmp").write_text(doc.dumps())
    os.replace(d / "maps.json.tmp", d / "maps.json")


def read_state(home: BrokerHome) -> dict:
    """The broker state at ``home``; SubcError when subc is not loaded there, or when the state
    is stale (:func:`~.broker_home.stale_reason`: ``subc unload`` clears it)."""
    try:
        state = json.loads(home.state_path.read_text())
    except (OSError, ValueError):
        raise SubcError(
            f"subc is not loaded on {home.iface} in this network namespace (no {home.state_path})"
        ) from None
    reason = stale_reason(state, home, attach.ifindex_or_none(home.iface), attach.link_device(home))
    if reason is not None:
        raise SubcError(
            f"the broker state of {home.iface} ({home.state_dir}) is stale: {reason}; "
            f"subc unload --iface {home.iface} clears it"
        )
    return state


def loaded_home(iface: str) -> tuple[BrokerHome, dict]:
    """The home and state of the broker loaded on ``iface`` in this network namespace
    (SubcError as :func:`~.broker_home.broker_home` and :func:`read_state`)."""
    home = broker_home(iface)
    return home, read_state(home)


def pinned_maps(home: BrokerHome, state: dict) -> dict[str, Map]:
    """Handles on the pinned maps of a loaded broker, each owning its descriptor: release them
    with :func:`close_maps`.  SubcError when a pin is missing (none is left open then)."""
    pins = home.pins
    out: dict[str, Map] = {}
    try:
        for name, m in state["maps"].items():
            out[name] = Map(
                obj_get(pins / name), m["key"], m["value"], percpu=m["type"].startswith("percpu"), name=name, owned=True
            )
    except SubcError:
        close_maps(out)
        raise
    return out


def close_maps(maps: dict[str, Map]) -> None:
    """Close the descriptors of the maps of :func:`pinned_maps`."""
    for m in maps.values():
        m.close()
