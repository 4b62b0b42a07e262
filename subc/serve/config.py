"""``subc serve``'s configuration: :class:`ServeConfig` and, for a P4 switch, :class:`SwitchOptions`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..lang.limits import DEFAULT_LIMITS, Limits
from ..recovery.service import ServiceOptions
from ..spec.model import Spec
from .acl import Acl
from .endpoints import resolve


@dataclass
class SwitchOptions:
    """``subc serve --p4runtime``: the switch's ``addr`` (HOST:PORT), ``program`` (a ``subc
    serve-program`` directory), device ``config`` (BMv2 JSON; sets the pipeline), ``port_map``
    file, ``grace`` in s between a root switch and freeing the old entries."""

    addr: str
    program: str
    port_map: str
    config: str | None = None
    device_id: int = 0
    election_id: tuple[int, int] = (0, 1)
    grace: float = 0.05


@dataclass
class ClusterOptions:
    """``subc serve --cluster``: etcd client ``endpoints`` (host:port), this broker's ``node``
    name, the key ``prefix``, its lease's ``ttl`` in s, how often (s) the whole prefix is read
    again to catch what a watch missed (``reconcile``), how far ahead of the feed (s of feed at
    its rate) a change takes effect (``lead``), and at least how many messages ahead
    (``lead_messages``)."""

    endpoints: list[str]
    node: str
    prefix: str = "/subc/"
    ttl: int = 5
    reconcile: float = 30.0
    lead: float = 0.05
    lead_messages: int = 0


@dataclass
class ServeConfig:
    """``subc serve``'s options: ``listen`` and ``metrics`` as (address, port), ``lease`` in s
    (None: subscriptions do not expire), ``capacity`` in subscriptions; ``journal``: the
    recovery service's options (docs/recovery.md) with the feed's ring of ``journal_pages``."""

    spec: Spec
    iface: str
    listen: tuple[str, int]
    field_order: list[str]
    state_dir: str | None = None
    rules: str | None = None
    lease: float | None = None
    acl: Acl = field(default_factory=Acl)
    metrics: tuple[str, int] | None = None
    capacity: int = 100_000
    limits: Limits = DEFAULT_LIMITS
    xdp_mode: str = "auto"
    resolver: Callable = resolve
    switch: SwitchOptions | None = None  # deliver through a P4 switch over P4Runtime instead of on iface
    journal: ServiceOptions | None = None  # journal every copy (the recovery service: re-requests, SoupBinTCP)
    journal_pages: int = 0  # the journal feed's ring buffer (4 KiB pages)
    cluster: ClusterOptions | None = None  # one broker of several sharing their state on etcd
