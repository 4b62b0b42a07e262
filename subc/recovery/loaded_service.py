"""The recovery service of a broker loaded with ``subc load --journal`` (and run again by ``subc
journal``): one stream per subscriber of the subscribers file, re-requestable from its endpoints,
SoupBinTCP logins from its ``soup`` entries (:mod:`.service`)."""

from __future__ import annotations

import hmac

from ..dataplane.ebpf.broker_state import loaded_home
from ..dataplane.ebpf.subscribers import load_subscribers
from ..errors import SubcError
from .service import RecoveryService, ServiceOptions


def check_login(logins: dict[str, tuple[str, str]], user: str, password: str) -> str | None:
    """The stream key of SoupBinTCP ``user`` when ``password`` matches (constant-time), or None.
    ``logins``: user -> (password, stream key)."""
    found = logins.get(user)
    if found is None or not hmac.compare_digest(found[0].encode(), password.encode()):
        return None
    return found[1]


def loaded_service(iface: str, options: ServiceOptions) -> RecoveryService:
    """The service of the broker loaded on ``iface`` here, its streams bound (key: the subscriber
    id).  Raises SubcError when subc is not loaded on ``iface`` in this network namespace, or was
    loaded without ``--journal``."""
    home, bstate = loaded_home(iface)
    if not bstate.get("journal"):
        raise SubcError(f"subc is loaded on {iface} without --journal: its data plane feeds no journal")
    subs = load_subscribers(bstate["subscribers"])
    logins = {login.user: (login.password, str(sid)) for sid, login in subs.soup.items()}
    svc = RecoveryService(home, options, accounts=lambda user, password: check_login(logins, user, password))
    try:
        for sid, eps in subs.by_id.items():
            svc.bind(sid, str(sid), [(e.ip, e.port) for e in eps], name=subs.names.get(sid, ""))
    except BaseException:
        svc.close()
        raise
    return svc
