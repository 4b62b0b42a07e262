"""Subscribers behind switch ports: ``subc serve --p4runtime``'s endpoints.

On a switch a delivery is a copy out of a port (or several: a multicast group), not a
rewritten datagram to an address as the eBPF data path sends.  ``--port-map FILE`` says which
port leads to which subscribers, one ``<network>/<len> <port>`` per line (``#`` comments); an
endpoint's port is that of the longest prefix holding its address.  The diagram's subscriber
number of an endpoint *is* its port, so subscribers behind one port share its copies: each
receives the datagrams any subscription of that port asked for (what a port-level filter can
do; exact per-subscriber delivery on a switch would need egress rewriting per replica).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from ..errors import SubcError


@dataclass
class _Ref:
    sid: int
    refs: int


def load_port_map(path: str, ports: list[int]) -> list[tuple[ipaddress.IPv4Network, int]]:
    """The (network, port) lines of ``path``, longest prefix first.  SubcError (``file:line:col:
    error:``) for a bad line or a port the program does not deliver to (``ports``)."""
    out = []
    lines = Path(path).read_text().splitlines()
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        col = line.index(parts[0]) + 1
        if len(parts) != 2:
            raise SubcError(f"{path}:{n}:{col}: error: expected '<network>/<len> <port>'\n{line}\n{' ' * (col - 1)}^")
        try:
            net = ipaddress.IPv4Network(parts[0], strict=False)
        except ValueError as e:
            raise SubcError(f"{path}:{n}:{col}: error: {e}\n{line}\n{' ' * (col - 1)}^") from None
        pcol = line.index(parts[1], col + len(parts[0]) - 1) + 1
        if not parts[1].isdigit() or int(parts[1]) not in ports:
            raise SubcError(
                f"{path}:{n}:{pcol}: error: port {parts[1]} is not a subscriber port of the program "
                f"({', '.join(map(str, ports))})\n{line}\n{' ' * (pcol - 1)}^"
            )
        out.append((net, int(parts[1])))
    return sorted(out, key=lambda x: -x[0].prefixlen)


class PortEndpoints:
    """The endpoint table of ``subc serve --p4runtime`` (the interface of
    :class:`~.endpoints.EndpointTable`): an endpoint's number is its switch port."""

    def __init__(self, port_map: list[tuple[ipaddress.IPv4Network, int]]):
        self.port_map = port_map
        self.by_ep: dict[tuple[str, int], _Ref] = {}

    def __len__(self) -> int:
        return len(self.by_ep)

    def port_of(self, ip: str) -> int:
        """The port of address ``ip``.  SubcError when no line of the map holds it."""
        try:
            a = ipaddress.IPv4Address(ip)
        except ValueError:
            raise SubcError(f"{ip} is not an IPv4 address") from None
        for net, port in self.port_map:
            if a in net:
                return port
        raise SubcError(f"no switch port leads to {ip} (--port-map)")

    def acquire(self, ep: tuple[str, int], fresh: bool = True) -> tuple[int, bool]:
        e = self.by_ep.get(ep)
        if e is not None:
            e.refs += 1
            return e.sid, False
        sid = self.port_of(ep[0])
        self.by_ep[ep] = _Ref(sid, 1)
        return sid, True

    def release(self, ep: tuple[str, int]) -> bool:
        e = self.by_ep[ep]
        e.refs -= 1
        if e.refs:
            return False
        del self.by_ep[ep]
        return True

    def take_draining(self) -> list:
        return []  # ports are never renumbered: nothing drains

    def free_drained(self, items) -> None:
        pass

    def free_sids(self, sids) -> None:
        pass

    def forget_known(self) -> list:
        return []
