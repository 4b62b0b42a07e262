"""Delivery endpoints of ``subc serve``: one subscriber number (sid) per (IPv4 address, UDP port).

The data plane delivers to subscriber numbers 0..511 (a leaf's 512-bit set, :mod:`..install`);
each number has one endpoint in ``subc_eps`` (index = sid), ``subc_subs[sid]`` = that endpoint,
its MoldUDP64 sequence number ``subc_seq[sid]`` (from 1) and its counters ``subc_sub_cnt[sid]``.
A number is written before the first change that delivers to it, and it is reused only after
the change that removed its last subscription has passed a grace period (no datagram can still
be classified to it), so a new endpoint never receives an old endpoint's messages.

An endpoint ``soup:<user>`` (port 0) is a SoupBinTCP user's stream: its number has no
``subc_eps`` entry, it is marked in ``subc_jnl_only`` and its copies are journaled, not sent
(``subc serve --journal --soup``).  ``on_number`` (the journal's :meth:`bind`) hears of every
number given to an endpoint, before any change delivers to it.

In a cluster (``subc serve --cluster``) a UDP endpoint that another broker delivers to is on
*standby* here: journal-only like a SoupBinTCP stream, its sequence numbers taken as the owner
takes them, so that this broker can take the stream over where the owner stopped
(:meth:`EndpointTable.set_standby`).

The next hop of an endpoint is found as the kernel would: the route to its address (pyroute2
``route get``) gives the interface and gateway, the neighbour table the next hop's MAC address;
a missing neighbour entry is resolved by sending one empty UDP datagram to the discard port (9)
of the next hop and waiting for the kernel's ARP exchange.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..backends.ebpf import map_names as MN
from ..backends.ebpf import layout as L
from ..errors import SubcError
from ..dataplane.ebpf.bpf import Map
from ..dataplane.ebpf.install import endpoint_value, subscriber_words
from ..dataplane.ebpf.subscribers import MAX_SUBSCRIBER_ID, Endpoint

NUD_USABLE = 0x02 | 0x04 | 0x08 | 0x10 | 0x80  # REACHABLE, STALE, DELAY, PROBE, PERMANENT
RESOLVE_WAIT_S = 1.0  # longest wait for an ARP exchange


def resolve(ip: str, port: int, sid: int = 0) -> Endpoint:
    """The :class:`~..subscribers.Endpoint` of ``ip``:``port`` (interface, next-hop MAC, source
    MAC and address), from this network namespace's routes and neighbours.  Raises SubcError
    when there is no route, the route is local (the broker's own host) or the next hop does not
    answer ARP within RESOLVE_WAIT_S."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        try:
            route = ipr.route("get", dst=ip)[0]
        except NetlinkError as e:
            raise SubcError(f"no route to {ip}: {e}") from None
        if route["type"] != 1:  # RTN_UNICAST; local and broadcast routes cannot be a subscriber's
            raise SubcError(f"{ip} is not a remote unicast address (route type {route['type']})")
        oif = route.get_attr("RTA_OIF")
        hop = route.get_attr("RTA_GATEWAY") or ip
        link = ipr.get_links(oif)[0]
        iface = link.get_attr("IFLA_IFNAME")
        src_mac = link.get_attr("IFLA_ADDRESS")
        src_ip = route.get_attr("RTA_PREFSRC")
        if src_ip is None:
            addrs = ipr.get_addr(index=oif, family=socket.AF_INET)
            if not addrs:
                raise SubcError(f"interface {iface} (towards {ip}) has no IPv4 address")
            src_ip = addrs[0].get_attr("IFA_ADDRESS")

        def neighbour() -> str | None:
            for n in ipr.get_neighbours(family=socket.AF_INET, ifindex=oif):
                if n.get_attr("NDA_DST") == hop and n["state"] & NUD_USABLE and n.get_attr("NDA_LLADDR"):
                    return n.get_attr("NDA_LLADDR")
            return None

        mac = neighbour()
        if mac is None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    s.sendto(b"", (hop, 9))
                except OSError:
                    pass
            end = time.monotonic() + RESOLVE_WAIT_S
            while mac is None and time.monotonic() < end:
                time.sleep(0.005)
                mac = neighbour()
            if mac is None:
                raise SubcError(f"next hop {hop} of {ip} does not answer ARP on {iface}")
    return Endpoint(sid, ip, port, mac, iface, oif, src_mac, src_ip)


#: The endpoint address of a SoupBinTCP user's stream: ``soup:<user>`` (its port is 0).
SOUP_PREFIX = "soup:"


def is_soup(ip: str) -> bool:
    """Whether an endpoint address names a SoupBinTCP user's stream (``soup:<user>``)."""
    return ip.startswith(SOUP_PREFIX)


def stream_key(ep: tuple[str, int]) -> str:
    """The name of endpoint ``ep``'s stream (its journal's key, the same on every broker of a
    cluster): ``IP:PORT``, or ``soup:<user>``."""
    return ep[0] if is_soup(ep[0]) else f"{ep[0]}:{ep[1]}"


@dataclass
class _Entry:
    sid: int
    refs: int


class EndpointTable:
    """Subscriber numbers of the endpoints (see the module docstring).  ``maps``: the loaded
    program's maps; ``known``: numbers a previous daemon gave ((ip, port) -> sid, from the
    store), kept for those endpoints; ``resolver``: ``(ip, port, sid) -> Endpoint``.

    Not thread-safe: the daemon's updater thread owns it (:meth:`drained` runs in the
    reclaimer thread under the same lock as the broker's changes)."""

    def __init__(
        self,
        maps: dict[str, Map],
        known: dict[tuple[str, int], int] | None = None,
        resolver=resolve,
        on_number: Callable[[int, tuple[str, int], bool], None] | None = None,
        standby: Callable[[tuple[str, int]], bool] | None = None,
    ):
        self.maps, self.resolver = maps, resolver
        self.standby = standby  # (ip, port) -> whether a new endpoint starts on standby (a cluster)
        self.on_standby: set[tuple[str, int]] = set()
        self.on_number = on_number  # (sid, endpoint, fresh): the journal binds the number's stream
        self.journal_only: set[int] = set()  # numbers of SoupBinTCP endpoints (soup:<user>)
        self.by_ep: dict[tuple[str, int], _Entry] = {}
        self.known = dict(known or {})
        used = set(self.known.values())
        self.free = [s for s in range(MAX_SUBSCRIBER_ID, -1, -1) if s not in used]
        self.draining: list[tuple[tuple[str, int], int]] = []  # refs 0, waiting for a grace period
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.by_ep)

    def sid(self, ep: tuple[str, int]) -> int | None:
        e = self.by_ep.get(ep)
        return e.sid if e else None

    def acquire(self, ep: tuple[str, int], fresh: bool = True) -> tuple[int, bool]:
        """The number of endpoint ``ep`` with one more subscription, and whether it is new (its
        maps were just written; with ``fresh`` False, a number the store gave keeps its sequence
        number and counters: a restarted daemon's subscribers see no new session).  Raises
        SubcError when it cannot be resolved or all 512 numbers are taken."""
        e = self.by_ep.get(ep)
        if e is not None:
            e.refs += 1
            return e.sid, False
        with self.lock:
            for i, (dep, _) in enumerate(self.draining):  # not yet reusable: keep its number
                if dep == ep:
                    kept = self.draining.pop(i)[1]
                    self.by_ep[ep] = _Entry(kept, 1)
                    self._everyone()
                    return kept, False
            sid = self.known.pop(ep, None)
            restart = sid is not None and not fresh
            if sid is None:
                if not self.free:
                    raise SubcError(
                        f"every subscriber number (0..{MAX_SUBSCRIBER_ID}) is in use: no room for a new endpoint"
                    )
                sid = self.free.pop()
            try:
                if is_soup(ep[0]) or (self.standby is not None and self.standby(ep)):
                    target = Endpoint(sid, ep[0], ep[1], "", "")
                    if not is_soup(ep[0]):
                        self.on_standby.add(ep)
                else:
                    target = self.resolver(ep[0], ep[1], sid)
                self._write(target, restart)
            except BaseException:
                self.free.append(sid)
                raise
        self.by_ep[ep] = _Entry(sid, 1)
        self._everyone()
        return sid, True

    def release(self, ep: tuple[str, int]) -> bool:
        """One subscription of ``ep`` fewer; True when it was its last (its number drains)."""
        e = self.by_ep[ep]
        e.refs -= 1
        if e.refs:
            return False
        del self.by_ep[ep]
        self.on_standby.discard(ep)
        with self.lock:
            self.draining.append((ep, e.sid))
        self._everyone()
        return True

    def take_draining(self) -> list[tuple[tuple[str, int], int]]:
        """The drained endpoints so far (the caller frees them with :meth:`free_drained` after a
        grace period that starts after this call)."""
        with self.lock:
            out, self.draining = self.draining, []
            return out

    def free_drained(self, items: list[tuple[tuple[str, int], int]]) -> None:
        """Make the numbers of drained ``items`` reusable (after their grace period)."""
        self.free_sids([sid for _, sid in items])

    def free_sids(self, sids) -> None:
        with self.lock:
            self.free.extend(sids)

    def hold(self, sids) -> list[int]:
        """Take ``sids`` out of use (a previous daemon's leaves may still deliver to them) until
        :meth:`free_sids`; returns those that were free."""
        with self.lock:
            taken = set(sids) & set(self.free)
            self.free = [s for s in self.free if s not in taken]
            return sorted(taken)

    def forget_known(self) -> list[tuple[tuple[str, int], int]]:
        """Stored endpoints that no restored subscription uses: removed from the table, their
        numbers neither used nor free (the caller frees or holds them)."""
        with self.lock:
            out = list(self.known.items())
            self.known.clear()
            return out

    def set_standby(self, ep: tuple[str, int], standby: bool) -> None:
        """Put UDP endpoint ``ep`` on standby (its copies journaled, not sent) or make it
        deliver (resolved again), keeping its number, sequence number and counters.  Raises
        SubcError when it cannot be resolved (it stays on standby)."""
        e = self.by_ep[ep]
        if is_soup(ep[0]) or (ep in self.on_standby) == standby:
            return
        key = L.U32.pack(v=e.sid)
        if standby:
            self._journal_only(e.sid, True)  # first: no copy is sent once the endpoint is gone
            self.maps[MN.SUBS].update(key, L.sub_struct(1).pack(count=0, ep=[0]))
            self.on_standby.add(ep)
            return
        target = self.resolver(ep[0], ep[1], e.sid)
        self.maps[MN.EPS].update(key, endpoint_value(target))
        self.maps[MN.SUBS].update(key, L.sub_struct(1).pack(count=1, ep=[e.sid]))
        self._journal_only(e.sid, False)
        self.on_standby.discard(ep)

    def _write(self, ep: Endpoint, restart: bool = False) -> None:
        sid = ep.subscriber
        key = L.U32.pack(v=sid)
        if is_soup(ep.ip) or not ep.mac:  # no endpoint (soup:<user>, or on standby): journaled, not sent
            self.maps[MN.SUBS].update(key, L.sub_struct(1).pack(count=0, ep=[0]))
            self._journal_only(sid, True)
        else:
            self.maps[MN.EPS].update(key, endpoint_value(ep))
            self.maps[MN.SUBS].update(key, L.sub_struct(1).pack(count=1, ep=[sid]))
            self._journal_only(sid, False)
        if not restart:
            self.maps[MN.SEQ].update(key, L.U64.pack(v=1))
            self.maps[MN.SUB_CNT].update(key, L.SUB_COUNTER.pack())  # on every CPU
        if self.on_number is not None:
            self.on_number(sid, (ep.ip, ep.port), not restart)

    def _journal_only(self, sid: int, on: bool) -> None:
        """Mark ``sid`` journal-only (``subc_jnl_only``) or not."""
        was = sid in self.journal_only
        if on == was:
            return
        if on:
            self.journal_only.add(sid)
        else:
            self.journal_only.discard(sid)
        if MN.JNL_ONLY not in self.maps:
            if on:
                raise SubcError("a SoupBinTCP endpoint needs the journal feed (subc serve --journal --soup)")
            return
        self.maps[MN.JNL_ONLY].update(L.U32.pack(v=0), L.SUBSET.pack(subs=subscriber_words(sorted(self.journal_only))))

    def _everyone(self) -> None:
        """``subc_all[0]``: every endpoint with a subscription (heartbeats go to them)."""
        self.maps[MN.ALL].update(
            L.U32.pack(v=0), L.SUBSET.pack(subs=subscriber_words(e.sid for e in self.by_ep.values()))
        )
