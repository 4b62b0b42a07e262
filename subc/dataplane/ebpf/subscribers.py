"""The subscribers file of the eBPF broker (TOML) and the resolution of its endpoints.

Format (one table per subscriber; ``id`` is the number rules name in ``fwd(id)``)::

    [[subscriber]]
    id = 1
    name = "desk-1"                       # optional
    endpoints = [{ ip = "10.10.1.2", port = 5001, mac = "02:00:0a:0a:01:02", iface = "brk-s1" }]

``ip`` and ``port`` are the IPv4 address and UDP port written into each copy, ``mac`` the
next-hop Ethernet address, ``iface`` the interface the copy leaves by; the copy's source MAC and
IPv4 address are that interface's (read with pyroute2 when the broker is loaded).

A subscriber may also (or only) take its stream over SoupBinTCP from the broker's journal
(``subc load --journal --soup``)::

    [[subscriber]]
    id = 6
    soup = { user = "alice", password = "s3cret" }   # SoupBinTCP 4.1: user <= 6, password <= 10 characters
    endpoints = []                                     # none: its copies are journaled, not sent
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import SubcError

MAX_SUBSCRIBER_ID = 511
MAC_RE = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}\Z")


@dataclass
class Endpoint:
    """Where one copy goes: destination ``ip``, UDP ``port``, next-hop ``mac``, outgoing ``iface``.

    ``ifindex``, ``src_mac`` and ``src_ip`` are filled by :func:`resolve_endpoints`.
    """

    subscriber: int
    ip: str
    port: int
    mac: str
    iface: str
    ifindex: int = 0
    src_mac: str = ""
    src_ip: str = ""


@dataclass(frozen=True)
class SoupLogin:
    """A subscriber's SoupBinTCP 4.1 login: ``user`` (1 to 6 characters), ``password`` (1 to 10),
    printable ASCII without spaces (the Login Request pads them with spaces)."""

    user: str
    password: str


@dataclass
class Subscribers:
    """Subscribers by id, each a list of endpoints; ``endpoints`` is every endpoint in file order
    (an endpoint's index in it is its index in the ``subc_eps`` map); ``soup``: the SoupBinTCP
    logins by subscriber id."""

    by_id: dict[int, list[Endpoint]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    path: str = ""
    soup: dict[int, SoupLogin] = field(default_factory=dict)

    def receives(self, sid: int) -> bool:
        """Whether subscriber ``sid`` takes copies: it has an endpoint, or a SoupBinTCP login (its
        copies journaled)."""
        return bool(self.by_id.get(sid)) or sid in self.soup

    @property
    def journal_only(self) -> list[int]:
        """The subscribers whose copies are journaled and not sent: a SoupBinTCP login, no endpoint."""
        return sorted(sid for sid in self.soup if not self.by_id.get(sid))

    @property
    def endpoints(self) -> list[Endpoint]:
        return [e for eps in self.by_id.values() for e in eps]

    def endpoint_indexes(self, subscriber: int) -> list[int]:
        """Indexes (into :attr:`endpoints`) of ``subscriber``'s endpoints."""
        out: list[int] = []
        i = 0
        for sid, eps in self.by_id.items():
            if sid == subscriber:
                out.extend(range(i, i + len(eps)))
            i += len(eps)
        return out


def _bad(path: str, msg: str) -> SubcError:
    return SubcError(f"{path}: error: {msg}")


def parse_subscribers(text: str, path: str = "<subscribers>") -> Subscribers:
    """Parse a subscribers file; raises SubcError naming the file and the bad entry."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _bad(path, f"not valid TOML: {e}") from None
    subs = Subscribers(path=path)
    items = doc.get("subscriber", [])
    if not isinstance(items, list):
        raise _bad(path, "'subscriber' must be an array of tables ([[subscriber]])")
    for n, item in enumerate(items, 1):
        where = f"subscriber #{n}"
        sid = item.get("id")
        if not isinstance(sid, int) or isinstance(sid, bool) or not 0 <= sid <= MAX_SUBSCRIBER_ID:
            raise _bad(path, f"{where}: 'id' must be an integer from 0 to {MAX_SUBSCRIBER_ID}")
        if sid in subs.by_id:
            raise _bad(path, f"{where}: subscriber id {sid} appears twice")
        eps = item.get("endpoints", [])
        if not isinstance(eps, list):
            raise _bad(path, f"{where}: 'endpoints' must be an array")
        out = []
        for m, ep in enumerate(eps, 1):
            w = f"{where} (id {sid}), endpoint #{m}"
            if not isinstance(ep, dict):
                raise _bad(path, f"{w}: must be a table {{ ip, port, mac, iface }}")
            unknown = set(ep) - {"ip", "port", "mac", "iface"}
            if unknown:
                raise _bad(path, f"{w}: unknown key(s) {', '.join(sorted(unknown))}")
            try:
                ip = str(ipaddress.IPv4Address(ep.get("ip", "")))
            except ValueError:
                raise _bad(path, f"{w}: 'ip' must be an IPv4 address") from None
            port = ep.get("port")
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                raise _bad(path, f"{w}: 'port' must be a UDP port from 1 to 65535")
            mac = ep.get("mac", "")
            if not isinstance(mac, str) or not MAC_RE.match(mac):
                raise _bad(path, f"{w}: 'mac' must be an Ethernet address like 02:00:0a:0a:01:02")
            iface = ep.get("iface", "")
            if not isinstance(iface, str) or not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", iface):
                raise _bad(path, f"{w}: 'iface' must be an interface name")
            out.append(Endpoint(sid, ip, port, mac.lower(), iface))
        subs.by_id[sid] = out
        if "name" in item:
            subs.names[sid] = str(item["name"])
        if "soup" in item:
            subs.soup[sid] = _soup_login(path, f"{where} (id {sid})", item["soup"], subs)
    return subs


_SOUP_FIELD = re.compile(r"[!-~]+\Z")  # printable ASCII, no space


def _soup_login(path: str, where: str, item: object, subs: Subscribers) -> SoupLogin:
    if not isinstance(item, dict) or set(item) != {"user", "password"}:
        raise _bad(path, f"{where}: 'soup' must be a table {{ user, password }}")
    user, password = item["user"], item["password"]
    if not isinstance(user, str) or not 1 <= len(user) <= 6 or not _SOUP_FIELD.match(user):
        raise _bad(path, f"{where}: soup 'user' must be 1 to 6 printable characters without spaces")
    if not isinstance(password, str) or not 1 <= len(password) <= 10 or not _SOUP_FIELD.match(password):
        raise _bad(path, f"{where}: soup 'password' must be 1 to 10 printable characters without spaces")
    if any(login.user == user for login in subs.soup.values()):
        raise _bad(path, f"{where}: soup user {user!r} appears twice")
    return SoupLogin(user, password)


def load_subscribers(path: str | Path) -> Subscribers:
    """:func:`parse_subscribers` of the file at ``path`` (unreadable: SubcError)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SubcError(f"cannot read subscribers file {path}: {e}") from None
    return parse_subscribers(text, str(path))


def resolve_endpoints(subs: Subscribers) -> None:
    """Fill each endpoint's ifindex, source MAC and source IPv4 from its interface (pyroute2, in
    the current network namespace).  Raises SubcError for an unknown interface or one with no
    IPv4 address."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        cache: dict[str, tuple[int, str, str]] = {}
        for ep in subs.endpoints:
            if ep.iface not in cache:
                idx = ipr.link_lookup(ifname=ep.iface)
                if not idx:
                    raise SubcError(f"{subs.path}: subscriber {ep.subscriber}: no interface '{ep.iface}'")
                link = ipr.get_links(idx[0])[0]
                addrs = ipr.get_addr(index=idx[0], family=2)
                if not addrs:
                    raise SubcError(f"{subs.path}: interface '{ep.iface}' has no IPv4 address (copies need a source)")
                cache[ep.iface] = (idx[0], link.get_attr("IFLA_ADDRESS"), addrs[0].get_attr("IFA_ADDRESS"))
            ep.ifindex, ep.src_mac, ep.src_ip = cache[ep.iface]
