"""Who may subscribe what for whom: the ACL file of ``subc serve`` and its per-source limits.

Without a grant, a request may direct deliveries only to its own source address (any port).
The ACL file (TOML, ``--acl``) grants more and sets the limits::

    [limits]
    subscriptions_per_source = 10000   # live subscriptions per source address
    requests_per_second = 1000         # per source address (a token bucket, burst = the rate)

    [[grant]]                           # requests from these networks may name endpoints in `to`
    source = "10.10.0.0/16"
    to = ["10.10.0.0/16"]

    [[grant]]                           # requests carrying this token (TOKEN <t>) likewise
    token = "s3cret"
    to = ["192.0.2.0/24"]

    [[login]]                           # a SoupBinTCP user (subc serve --journal --soup): its own
    user = "alice"                      # stream soup:alice; 1 to 6 and 1 to 10 printable characters
    password = "s3cret"                 # without spaces (SoupBinTCP 4.1 Login Request)

Errors: :class:`~subc.errors.SubcError` with the file's path for a malformed file.
"""

from __future__ import annotations

import hmac
import ipaddress
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SubcError

DEFAULT_SUBS_PER_SOURCE = 100_000
DEFAULT_REQUESTS_PER_SECOND = 5_000.0


@dataclass
class Grant:
    """Requests from ``source`` (a network, or None) or with ``token`` may name endpoints in ``to``."""

    to: list[ipaddress.IPv4Network]
    source: ipaddress.IPv4Network | None = None
    token: str | None = None


@dataclass
class Acl:
    """The grants, the per-source limits and the SoupBinTCP logins (user -> password)."""

    grants: list[Grant] = field(default_factory=list)
    subs_per_source: int = DEFAULT_SUBS_PER_SOURCE
    requests_per_second: float = DEFAULT_REQUESTS_PER_SECOND
    logins: dict[str, str] = field(default_factory=dict)

    def check_login(self, user: str, password: str) -> bool:
        """Whether a ``[[login]]`` has ``user`` and ``password`` (compared in constant time)."""
        known = self.logins.get(user)
        return known is not None and hmac.compare_digest(known.encode(), password.encode())

    def may_send_to(self, source_ip: str, to_ip: str, token: str | None) -> bool:
        """Whether a request from ``source_ip`` (with ``token``) may direct deliveries to ``to_ip``
        (a source that is no IPv4 address, a SoupBinTCP user's ``soup:<user>``, has only the
        token grants)."""
        if to_ip == source_ip:
            return True
        try:
            dst = ipaddress.IPv4Address(to_ip)
        except ValueError:
            return False
        try:
            src: ipaddress.IPv4Address | None = ipaddress.IPv4Address(source_ip)
        except ValueError:
            src = None
        for g in self.grants:
            if g.source is not None and (src is None or src not in g.source):
                continue
            if g.token is not None and (token is None or not hmac.compare_digest(g.token, token)):
                continue
            if any(dst in net for net in g.to):
                return True
        return False

    def token_grants(self, token: str, to_ip: str) -> bool:
        """Whether a grant of ``token`` (a ``token`` grant, not a ``source`` one) lets requests
        direct deliveries to ``to_ip``: such a request needs no address proof (the token is the
        proof, :mod:`.proof`)."""
        try:
            dst = ipaddress.IPv4Address(to_ip)
        except ValueError:
            return False
        return any(
            g.token is not None
            and hmac.compare_digest(g.token.encode(), token.encode())
            and any(dst in net for net in g.to)
            for g in self.grants
        )


def load_acl(path: str | Path | None) -> Acl:
    """The ACL of ``path`` (None: no grant, default limits).  Raises SubcError for a bad file."""
    if path is None:
        return Acl()
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SubcError(f"{path}: cannot read the ACL: {e}") from None
    acl = Acl()
    lim = doc.get("limits", {})
    try:
        acl.subs_per_source = int(lim.get("subscriptions_per_source", DEFAULT_SUBS_PER_SOURCE))
        acl.requests_per_second = float(lim.get("requests_per_second", DEFAULT_REQUESTS_PER_SECOND))
        for i, g in enumerate(doc.get("grant", [])):
            if ("source" in g) == ("token" in g):
                raise ValueError(f"grant {i + 1}: give one of 'source' or 'token'")
            if not isinstance(g.get("to"), list) or not g["to"]:
                raise ValueError(f"grant {i + 1}: 'to' must be a list of networks")
            acl.grants.append(
                Grant(
                    [ipaddress.IPv4Network(n) for n in g["to"]],
                    ipaddress.IPv4Network(g["source"]) if "source" in g else None,
                    str(g["token"]) if "token" in g else None,
                )
            )
        for i, lg in enumerate(doc.get("login", [])):
            user, password = lg.get("user"), lg.get("password")
            if set(lg) != {"user", "password"} or not _soup_field(user, 6) or not _soup_field(password, 10):
                raise ValueError(
                    f"login {i + 1}: 'user' (1 to 6) and 'password' (1 to 10 printable characters, no spaces)"
                )
            if user in acl.logins:
                raise ValueError(f"login {i + 1}: user {user!r} appears twice")
            acl.logins[user] = password
    except (ValueError, TypeError) as e:
        raise SubcError(f"{path}: {e}") from None
    if acl.subs_per_source < 1 or acl.requests_per_second <= 0:
        raise SubcError(f"{path}: limits must be positive")
    return acl


def _soup_field(v: object, most: int) -> bool:
    return isinstance(v, str) and 1 <= len(v) <= most and all("!" <= ch <= "~" for ch in v)
